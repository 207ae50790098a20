"""braid.distributed: the same distributed runtime as C++ (braid/distributed/*.h), for scripts
started with `mpiexec -n N python3 train.py` or `srun python3 train.py`.

    info = braid.distributed.init()      # initialises MPI when nobody has; a world of one otherwise
    ddp = braid.distributed.DistributedDataParallel(model)
    loss_fn(ddp(x), y).backward()        # gradients are averaged across ranks during backward
"""

import contextlib
import sys
import traceback

from . import _tensor
from ._swig import distributed as _dist

ReduceOp = type("ReduceOp", (), {"SUM": _dist.ReduceOp_Sum, "AVG": _dist.ReduceOp_Average,
                                 "MAX": _dist.ReduceOp_Max, "MIN": _dist.ReduceOp_Min})
InitOptions = _dist.InitOptions
WorldInfo = _dist.WorldInfo
ProcessGroup = _dist.ProcessGroup
is_initialized = _dist.is_initialized
finalize = _dist.finalize
world_info = _dist.world_info
rank_table = _dist.rank_table
set_timeout = _dist.set_timeout
world = _dist.world
# torch.distributed's functions, over the world unless group= names a group.
get_rank = _dist.get_rank
get_world_size = _dist.get_world_size
all_reduce = _dist.all_reduce
broadcast = _dist.broadcast
all_gather = _dist.all_gather
barrier = _dist.barrier
# The pipeline's and SyncBatchNorm's names, as the C++ API has them.
globals().update({_n: getattr(_dist, _n) for _n in (
    "SyncBatchNorm", "convert_sync_batchnorm", "gpipe_schedule", "one_f_one_b_schedule", "interleaved_schedule",
    "zb_h1_schedule", "make_schedule", "validate", "StepCosts", "PipelineOptions", "make_grid", "partition",
    "profile_layers", "stage_layers", "GridShape", "TopKHook", "PowerSGDHook", "allreduce_hook", "Join", "LocalSGD",
    "ParameterServer", "place_variables", "HierarchicalOptions", "node_layout", "make_hierarchical_group")})

_previous_excepthook = sys.excepthook


def _end_job_on_exception(kind, value, tb):
    # An uncaught Python exception on one rank ends every rank at once, with the rank named, as an
    # uncaught C++ exception does (InitOptions.handle_failures).
    text = "".join(traceback.format_exception(kind, value, tb))
    info = _dist.world_info()
    if info.size > 1:
        _dist.abort_job(f"braid: rank {info.rank} of {info.size} failed with an uncaught Python exception:\n{text}")
    _previous_excepthook(kind, value, tb)


def init(**options):
    """Starts the distributed runtime (idempotent) and returns this process's WorldInfo (rank, size,
    local_rank, local_size, launcher, host). Keywords: InitOptions' fields (timeout_seconds, debug,
    handle_failures)."""
    info = _dist.init(**options)
    if options.get("handle_failures", True):
        sys.excepthook = _end_job_on_exception
    return info


# ---- preemption (Note [Preemption] in braid/distributed/preemption.h) ----

#: The exit code that asks model_zoo/slurm's job scripts to requeue the job (EX_TEMPFAIL).
REQUEUE_EXIT_CODE = _dist.kRequeueExitCode


catch_preemption_signals = _dist.catch_preemption_signals


def preemption_requested(group=None, step=None):
    """Whether any rank has caught a preemption signal: a collective that every rank calls after each
    step, so that all of them stop after the same one. Then write a checkpoint and
    sys.exit(braid.distributed.REQUEUE_EXIT_CODE). Pass the global step that just ended as step=, as
    braid-train does (Note [Holding for a preemption test])."""
    if step is not None:
        return _dist.preemption_requested(group if group is not None else _dist.world(), int(step))
    return _dist.preemption_requested(group) if group is not None else _dist.preemption_requested()


preemption_signal = _dist.preemption_signal


class DistributedDataParallel(_dist.DistributedDataParallel):
    """Averages module's gradients across ranks while backward runs (bucketed, overlapped). It
    attaches to the parameters: calling it is calling the module, and state_dict names stay the
    model's. Keywords: DataParallelOptions' fields. Collective: every rank constructs it."""

    def __init__(self, module, group=None, **options):
        super().__init__(module, group, **options)  # the C++ object keeps module alive
        self.module = module

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes in this scope accumulate gradients locally; the first backward after it
        all-reduces what was accumulated (gradient accumulation, as PyTorch's DDP.no_sync)."""
        guard = _dist.DataParallelNoSync(self)
        try:
            yield
        finally:
            del guard

    def __getattr__(self, name):  # parameters, named_parameters, state_dict, load_state_dict: the module's
        return getattr(self.module, name)

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)


# One stage of a pipeline: this rank's part of the model (a Python module works too); keywords:
# PipelineOptions' fields.
PipelineStage = _dist.PipelineStage
