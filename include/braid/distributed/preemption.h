// Preemption: stopping a training job cleanly when its batch scheduler says it will stop it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/distributed/process_group.h"

namespace braid::distributed {

// Note [Preemption]
// A batch scheduler warns a job before it stops it: Slurm sends SIGTERM to every task before it
// kills a job (preemption, time limit, scancel), and `sbatch --signal=B:USR1@60` sends SIGUSR1 to the
// job script a minute before the time limit, which the script forwards to its tasks. Signals reach
// the ranks at different moments, so no rank may act on its own: after each step every rank calls
// preemption_requested(), a max all-reduce of one integer, and all of them see the same answer after
// the same step. The training loop then writes a checkpoint of that step (model, optimizer,
// schedule, random state, the loader's position in the epoch), and the program exits with
// kRequeueExitCode, which model_zoo/slurm's job scripts turn into `scontrol requeue`; the requeued job
// resumes from the checkpoint and ends with the weights an uninterrupted run ends with.
// The handler only records the signal: everything else happens at the next step boundary. So once
// caught, SIGTERM no longer ends a process at once (nor prints braid's fatal-signal message): a rank
// stuck in a collective is ended by BRAID_TIMEOUT, or by the SIGKILL that Slurm sends KillWait
// seconds after its SIGTERM. A program catches them from its first moments, before MPI, data and
// checkpoint loading: a warning that comes while a job starts then stops it after its first step
// instead of killing its ranks, and the job scripts pass on a signal that reaches them before srun
// has started. Once SIGTERM is caught, braid's fatal-signal report (distributed::init) leaves it be.

// Note [Holding for a preemption test]
// A test of preemption must make the signal arrive at a known point of the job, whatever the
// machine's speed: a test that waits for a line of output and then sleeps before signalling lets a
// fast machine finish the job first. BRAID_TEST_HOLD_AT_STEPS="N[,M...]" (for tests only: no
// program's --help shows it) makes a job wait for its preemption signal at those steps:
// - after step N > 0, preemption_requested(group, N) prints "braid: holding after step N for a
//   preemption signal" (rank 0, to stderr) and polls the flag over the group (a max all-reduce every
//   few milliseconds, so every rank leaves the hold after the same poll) until a rank has caught a
//   signal, then returns true: the job stops after exactly step N, and the test asserts that step.
//   A job resumed after step N does not stop at N again, so a list of steps makes one job requeue
//   once per step (Slurm's time-limit test).
// - 0 holds in catch_preemption_signals() itself, before MPI, data or model exist ("braid: pid P
//   holding before start for a preemption signal", every process): a signal sent then is one that
//   arrives while the job starts. A requeued job (SLURM_RESTART_COUNT > 0) does not hold there again.
// A hold that sees no signal within BRAID_TEST_HOLD_LIMIT seconds (default 600) throws a
// DistributedError naming the step: the limit only catches a test that never signals.

/// Catches SIGUSR1 and SIGTERM from now on, replacing their handlers.
void catch_preemption_signals();
/// Catches the given signals instead.
void catch_preemption_signals(const std::vector<int>& signals);
/// Whether any rank of group has caught a preemption signal. A collective (every rank of the group
/// calls it, after each step): all ranks get the same answer.
bool preemption_requested(const ProcessGroupPtr& group);
bool preemption_requested();  // over world()
/// The same, after global step `step`: the form a training loop calls, so that a test can hold the job
/// at a known step (Note [Holding for a preemption test]).
bool preemption_requested(const ProcessGroupPtr& group, int64_t step);
bool preemption_requested(int64_t step);  // over world()
/// The signal this rank caught ("SIGUSR1", "SIGTERM"), or "" when it caught none (a peer did).
std::string preemption_signal();
/// Forgets a caught signal (tests; a program that handled one and goes on).
void clear_preemption();
/// The exit code that asks the job script to requeue the job: EX_TEMPFAIL, "try again later".
constexpr int kRequeueExitCode = 75;

}  // namespace braid::distributed
