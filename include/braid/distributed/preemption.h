// Preemption: stopping a training job cleanly when its batch scheduler says it will stop it.
#pragma once

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

/// Catches SIGUSR1 and SIGTERM from now on, replacing their handlers.
void catch_preemption_signals();
/// Catches the given signals instead.
void catch_preemption_signals(const std::vector<int>& signals);
/// Whether any rank of group has caught a preemption signal. A collective (every rank of the group
/// calls it, after each step): all ranks get the same answer.
bool preemption_requested(const ProcessGroupPtr& group);
bool preemption_requested();  // over world()
/// The signal this rank caught ("SIGUSR1", "SIGTERM"), or "" when it caught none (a peer did).
std::string preemption_signal();
/// Forgets a caught signal (tests; a program that handled one and goes on).
void clear_preemption();
/// The exit code that asks the job script to requeue the job: EX_TEMPFAIL, "try again later".
constexpr int kRequeueExitCode = 75;

}  // namespace braid::distributed
