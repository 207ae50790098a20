"""braid.checkpoint: saving and restoring training state in braid's checkpoint format
(braid/checkpoint.h): modules, optimizers, schedulers, scalers, data loaders and plain values.

    ckpt = braid.checkpoint.Checkpoint()
    braid.checkpoint.store(ckpt, "model.", model)
    braid.checkpoint.store(ckpt, "optim.", opt)
    braid.checkpoint.store(ckpt, "loader.", train_loader)   # epoch and batch: resumes mid-epoch
    ckpt.integers["step"] = 3
    braid.checkpoint.save("run.braid", ckpt)     # written atomically
    ckpt = braid.checkpoint.load("run.braid")
    braid.checkpoint.restore(ckpt, "model.", model)

ckpt.tensors, scalars, integers and strings are views into the checkpoint (writes go through) that
keep it alive. store puts an object's state (a module, optimizer, scheduler, scaler, data loader or
generator) under a prefix; restore checks the entries first, and its errors name the checkpoint's
file and the entry.
"""

from ._swig.io import Checkpoint, save_checkpoint as save, load_checkpoint as load  # noqa: F401
from ._swig.io import store_state as store, restore_state as restore  # noqa: F401
