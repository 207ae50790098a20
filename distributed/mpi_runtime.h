// The MPI side of the runtime: how the program was launched, starting and stopping MPI, the
// failure handlers and the control thread that answers peers' progress queries.
#pragma once

#include <string>

#include "braid/distributed/process_group.h"
#include "distributed/internal.h"

namespace braid::distributed::detail {

/// What the environment says about the launcher.
struct Launch {
  std::string kind = "none";  // "mpiexec", "srun", "mpi" or "none"
  int expected_size = 1;      // ranks the launcher promised (0 when it does not say)
  std::string expected_from;  // the variable that said so
};
Launch detect_launch();

#ifdef BRAID_DISTRIBUTED_MPI
/// Initialises MPI (thread-multiple), checks the world against launch, fills info and the rank
/// table, installs the failure handlers and starts the control thread.
void mpi_start(const Launch& launch, bool handle_failures, WorldInfo& info, std::string& table);
void mpi_stop();
[[noreturn]] void mpi_abort(const std::string& message, int code);

/// Asks the members of a group (given by their world ranks) how far they have got on it, waiting at
/// most a few seconds; returns a sentence naming the ranks that have not called collective seq (with
/// their latest call and what they are executing now) and those whose call seq differs from mine.
std::string who_did_not_arrive(uint64_t group_id, int64_t seq, const CallSig& mine, const std::vector<int>& world_ranks,
                               std::string (*describe)(const CallSig&));
#endif

}  // namespace braid::distributed::detail
