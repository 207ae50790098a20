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
"""

from ._swig import io as _io

Checkpoint = _io.Checkpoint
save = _io.save_checkpoint
load = _io.load_checkpoint


def _owning(prop):
    # ck.tensors (integers, scalars, strings) is a view into the C++ Checkpoint, so that writes
    # through it change the checkpoint; the view keeps its checkpoint alive, which makes
    # `braid.checkpoint.load(path).integers["step"]` safe although the checkpoint is a temporary.
    def get(self):
        view = prop.fget(self)
        view._owner = self
        return view
    return property(get, prop.fset, doc=prop.__doc__)


for _name in ("tensors", "scalars", "integers", "strings"):
    setattr(Checkpoint, _name, _owning(getattr(Checkpoint, _name)))


def _cxx(obj):
    # braid.data.DataLoader holds the C++ loader that the checkpoint functions take.
    return obj.__dict__.get("_loader", obj) if hasattr(obj, "__dict__") else obj


def store(ckpt, prefix, obj):
    """Stores obj's state (a module, optimizer, scheduler, scaler, data loader or generator) under prefix."""
    _io.store_state(ckpt, prefix, _cxx(obj))


def restore(ckpt, prefix, obj):
    """Restores obj's state from the entries under prefix; errors name the checkpoint and the entry."""
    _io.restore_state(ckpt, prefix, _cxx(obj))
