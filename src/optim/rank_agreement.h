// How the optimizers' code, which knows nothing of distribution, learns whether a flag is set on
// any rank: a hook that the distributed runtime installs (Note [Skipping a step on every rank] in
// grad_scaler.cpp). Not installed.
#pragma once

#include <functional>

namespace braid::optim::detail {

/// Given this rank's flag, returns whether any rank of the job has it set. Collective.
using AnyRankHook = std::function<bool(bool local)>;

/// distributed::init() installs the world's hook and finalize() removes it (an empty hook).
void set_any_rank_hook(AnyRankHook hook);
/// Whether local is set on any rank, through the hook; local itself when none is installed (this
/// process is the whole job).
bool any_rank(bool local);

}  // namespace braid::optim::detail
