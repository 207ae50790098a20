"""A real single-node Slurm for the tests: munge, slurmctld and slurmd on this machine, with a
slurm.conf of the test's own (its own ports, spool and state folders), started once per session and
stopped at its end. Jobs are submitted with sbatch and followed with squeue and scontrol (sacct needs
slurmdbd and a database, which a single test node does not run).

What these machines taught (Debian 12, Slurm 22.05, munge 0.5.15):
- munged must run as the munge user, and /run/munge must exist (owned by munge) first;
- slurmd takes the node's name with -N; the node here is called localhost;
- `sbatch --wait` and mail notifications need a MailProg (/bin/true does);
- a job requeued by `scontrol requeue` waits about two minutes (Reason=BeginTime) before it may start
  again; the tests move its start time to now, as an operator would with `scontrol update`, once the
  slurmstepd processes of its previous run are gone (a requeued job reuses its job and step ids, and
  started at once its srun's PMI-2 messages went to the old step: "failed to send temp kvs") and a
  few seconds have passed (slurmd refuses a credential issued in the second its predecessor was
  revoked: "Killing non-startable batch job: Job credential revoked"), timed from each requeue, not
  only the first.
"""

import os
import re
import shutil
import signal
import subprocess
import time

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel", "srun", "munge", "unmunge")
SETTLE = 2.0  # seconds a job's final state must hold (see SlurmCluster.wait)
REQUEUE_GRACE = 3.0  # seconds a requeued job stays held before the tests let it start (module docstring)
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                "PREEMPTED"}


def _requeue_in_flight(rec):
    """Whether the job's last run ended by requeueing it: model_zoo/slurm's scripts print a line when
    each run starts and "requeueing job" before `scontrol requeue`, so a job with as many requeues
    announced as runs started will run again, whatever state Slurm shows for the moment."""
    path = rec.get("StdOut", "")
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return False
    announced = text.count("requeueing job")
    runs = len(re.findall(r"\.sbatch: job \d+ run \d+ on ", text))  # the scripts' line at each run's start
    return announced > 0 and announced >= runs


class SlurmUnavailable(Exception):
    """Why Slurm cannot start here (the tests skip with this reason)."""


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _cpu_line():
    """slurmd -C's description of this machine's CPUs, for the node's line in slurm.conf."""
    out = _run(["slurmd", "-C"]).stdout
    m = re.search(r"CPUs=(\d+) Boards=(\d+) SocketsPerBoard=(\d+) CoresPerSocket=(\d+) ThreadsPerCore=(\d+)", out)
    if not m:
        raise SlurmUnavailable(f"slurmd -C did not describe the node: {out.strip()!r}")
    return m.group(0)


class SlurmCluster:
    def __init__(self, root, port=16817):
        self.root = root
        self.port = port
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for k in list(self.env):  # a test run inside a Slurm job must not submit into that job's allocation
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del self.env[k]
        self.procs = []
        self.started_munge = None

    # ---- start and stop ----

    def start(self):
        if os.geteuid() != 0:
            raise SlurmUnavailable("not root: slurmd must run as root to start jobs as the submitting user")
        missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists("/usr/sbin/" + d)]
        if missing:
            raise SlurmUnavailable("not installed: " + ", ".join(missing) + " (Debian's slurm-wlm and munge)")
        self._start_munge()
        for d in ("state", "spool"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(self._conf_text())
        self._spawn(["slurmctld", "-D", "-c", "-f", self.conf], "slurmctld.out")
        self._wait_for(lambda: _run(["scontrol", "ping"], env=self.env).stdout.find("UP") >= 0, 30,
                       "slurmctld did not answer scontrol ping", "slurmctld.log")
        self._spawn(["slurmd", "-D", "-N", "localhost", "-f", self.conf], "slurmd.out")
        self._wait_for(lambda: _run(["sinfo", "-h", "-o", "%t"], env=self.env).stdout.strip() == "idle", 30,
                       "the node did not become idle", "slurmd.log")

    def cancel_all(self):
        """Cancels every job (SIGKILL: a job that catches SIGTERM would checkpoint and requeue) and waits
        until the queue is empty."""
        _run(["scancel", "--quiet", "--user", "root", "--signal=KILL", "--full"], env=self.env)
        _run(["scancel", "--quiet", "--user", "root"], env=self.env)
        deadline = time.time() + 30
        while time.time() < deadline and _run(["squeue", "-h"], env=self.env).stdout.strip():
            time.sleep(0.5)

    def stop(self):
        self.cancel_all()
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.started_munge:
            self.started_munge.send_signal(signal.SIGTERM)

    def _start_munge(self):
        def works():
            enc = _run(["munge", "-n"])
            return enc.returncode == 0 and _run(["unmunge"], input=enc.stdout).returncode == 0
        if works():
            return
        if not os.path.exists("/etc/munge/munge.key"):
            r = _run(["runuser", "-u", "munge", "--", "mungekey", "--create"])
            if r.returncode != 0:
                raise SlurmUnavailable("no /etc/munge/munge.key and mungekey --create failed: " + r.stderr.strip())
        for d in ("/run/munge", "/var/lib/munge", "/var/log/munge"):
            os.makedirs(d, exist_ok=True)
            shutil.chown(d, "munge", "munge")
        munged = shutil.which("munged") or "/usr/sbin/munged"
        # --foreground so that stop() can end it; as the munge user, which munged insists on.
        self.started_munge = subprocess.Popen(["runuser", "-u", "munge", "--", munged, "--foreground"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while not works():
            if time.time() > deadline or self.started_munge.poll() is not None:
                raise SlurmUnavailable("munged did not start (munge -n | unmunge fails)")
            time.sleep(0.2)

    def _conf_text(self):
        r = self.root
        return f"""# Written by tests/slurm/cluster.py for one test session.
ClusterName=braidtest
SlurmctldHost=localhost
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmdSpoolDir={r}/spool
StateSaveLocation={r}/state
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillOnBadExit=1
KillWait=10
JobRequeue=1
MinJobAge=3600
MailProg=/bin/true
NodeName=localhost {_cpu_line()} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""

    def _spawn(self, cmd, log):
        out = open(os.path.join(self.root, log), "w")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT))

    def _wait_for(self, ok, seconds, what, log):
        deadline = time.time() + seconds
        while not ok():
            if time.time() > deadline or any(p.poll() is not None for p in self.procs):
                tail = ""
                path = os.path.join(self.root, log)
                if os.path.exists(path):
                    tail = "".join(open(path).readlines()[-5:])
                self.stop()
                raise SlurmUnavailable(f"{what} within {seconds} s; {log} ends with:\n{tail}")
            time.sleep(0.3)

    # ---- jobs ----

    def sbatch(self, script, *args, options=(), env=None, cwd=None):
        """Submits script with its arguments; returns the job id."""
        e = dict(self.env, **(env or {}))
        r = _run(["sbatch", "--parsable", *options, script, *args], env=e, cwd=cwd)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch {script} failed: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def jobs(self, job_id):
        """scontrol's record of the job (one dict per array task), as key -> value."""
        out = _run(["scontrol", "show", "job", "-o", str(job_id)], env=self.env).stdout
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]

    def state(self, job_id):
        j = self.jobs(job_id)
        return j[0] if j else {}

    def wait(self, job_id, timeout, states=FINAL_STATES, release_requeued=True):
        """Waits until every task of the job is in one of states; returns their records. A job that
        was requeued is let start again at once (see the module's docstring)."""
        deadline = time.time() + timeout
        settled_since, last = None, None
        requeued_at = {}
        while True:
            recs = self.jobs(job_id)
            # A job that requeues itself shows a final state (FAILED) for a moment on its way back
            # to PENDING: a state counts once it has held for SETTLE seconds.
            # Its script says so first (_requeue_in_flight): such a job is on its way back however long
            # the final state shows.
            seen = [(r.get("JobId"), r.get("JobState"), r.get("Restarts")) for r in recs]
            if recs and all(r.get("JobState") in states and not _requeue_in_flight(r) for r in recs):
                if seen != last:
                    settled_since, last = time.time(), seen
                elif time.time() - settled_since >= SETTLE:
                    return recs
            else:
                settled_since, last = None, None
            if release_requeued:
                for r in recs:
                    if r.get("JobState") == "PENDING" and r.get("Reason") == "BeginTime" and int(r.get("Restarts", 0)) > 0:
                        # Timed per restart: a job requeued a second time must wait its own grace
                        # (timed from the first, it was started in the second its credential was
                        # revoked, and slurmd killed it).
                        held = requeued_at.setdefault((r["JobId"], r.get("Restarts")), time.time())
                        if time.time() - held >= REQUEUE_GRACE and not self._steps_alive(r["JobId"]):
                            _run(["scontrol", "update", f"JobId={r['JobId']}", "StartTime=now"], env=self.env)
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} not done after {timeout} s: " +
                                   "; ".join(f"{r.get('JobId')} {r.get('JobState')} ({r.get('Reason')})" for r in recs))
            time.sleep(0.5)

    @staticmethod
    def _steps_alive(job_id):
        """Whether a slurmstepd of the job's previous run is still there. A requeued job reuses its
        id and step ids, and its new srun's PMI-2 messages can reach the old step's slurmstepd, so
        it must not start before those are gone (what Slurm's delay is for)."""
        return _run(["pgrep", "-f", rf"slurmstepd: \[{job_id}\."]).returncode == 0

    def signal(self, job_id, sig, batch_only):
        """Sends sig the way Slurm does: to the job script alone (what `--signal=B:SIG@T` does) or to
        every task of the job's steps (what Slurm does with SIGTERM before it kills a job). Not with
        --full: Slurm 22.05 then cancels the job outright (SIGKILL, no SIGTERM reaches the tasks)."""
        opts = ["--batch"] if batch_only else []
        r = _run(["scancel", f"--signal={sig}", *opts, str(job_id)], env=self.env)
        if r.returncode != 0:
            raise RuntimeError(f"scancel --signal={sig} {job_id}: {r.stderr.strip()}")
