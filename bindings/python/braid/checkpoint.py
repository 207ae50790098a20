"""braid.checkpoint: saving and restoring training state in braid's checkpoint format
(braid/checkpoint.h): modules, optimizers, schedulers, scalers, data loaders and plain values.

    ckpt = braid.checkpoint.Checkpoint()
    braid.checkpoint.store(ckpt, "model", model)
    braid.checkpoint.store(ckpt, "optimizer", opt)
    ckpt.integers["epoch"] = 3
    braid.checkpoint.save("run.braid", ckpt)     # written atomically
    ckpt = braid.checkpoint.load("run.braid")
    braid.checkpoint.restore(ckpt, "model", model)
"""

from ._swig import io as _io

Checkpoint = _io.Checkpoint
save = _io.save_checkpoint
load = _io.load_checkpoint
store = _io.store_state
restore = _io.restore_state
