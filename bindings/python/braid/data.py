"""braid.data: datasets, the DataLoader, transforms and readers (braid/data/*.h).

A Dataset written in Python defines __len__ and __getitem__ (returning (input, target), each a
Tensor, a NumPy array or a number), as in PyTorch; the DataLoader's background thread calls it
(taking the GIL), batches and shuffles with braid's deterministic sampler, and prefetches.

    loader = braid.data.DataLoader((x_array, y_array), batch_size=64, shuffle=True)
    for x, y in loader: ...
"""

import numbers

import numpy as np

from . import _tensor
from ._swig import data as _data

Dataset = _data.Dataset
TensorDataset = _data.TensorDataset
Example = _data.Example
Normalize = _data.Normalize
RandomCrop = _data.RandomCrop
RandomHorizontalFlip = _data.RandomHorizontalFlip
load_mnist = _data.load_mnist
load_cifar10 = _data.load_cifar10
read_idx = _data.read_idx
read_npy = _data.read_npy
write_npy = _data.write_npy
read_csv = _data.read_csv


def _as_tensor(v):
    if isinstance(v, _tensor.Tensor):
        return v
    if isinstance(v, numbers.Number):
        return _tensor.tensor(v)
    return _tensor.as_tensor(np.ascontiguousarray(v))


def _example(item):
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise TypeError(f"Dataset.__getitem__ must return (input, target), got {type(item).__name__}")
    e = _data.Example()
    e.input = _as_tensor(item[0])
    e.target = _as_tensor(item[1])
    return e


# What C++ calls on a Dataset written in Python (a director): size() and get(index).
Dataset.size = lambda self: len(self)
Dataset.get = lambda self, index: _example(self[index])
_dataset_init = Dataset.__init__


def _dataset_init_py(self, *args, **kwargs):
    _dataset_init(self)


Dataset.__init__ = _dataset_init_py


class DataLoader:
    """Batches of (input, target) from a Dataset (C++ or Python) or from a pair of arrays/tensors.

    Keyword arguments are DataLoaderOptions' fields: batch_size, shuffle, drop_last, seed, prefetch,
    num_shards and shard (for data-parallel ranks), transforms, and device (batches are moved there
    by the prefetch thread)."""

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, seed=0, prefetch=2, num_shards=1,
                 shard=0, transforms=(), device=None):
        if isinstance(dataset, (tuple, list)):
            if len(dataset) != 2:
                raise ValueError("DataLoader: a dataset given as a sequence must be (inputs, targets)")
            dataset = TensorDataset(_as_tensor(dataset[0]), _as_tensor(dataset[1]))
        if not isinstance(dataset, _data.Dataset):
            raise TypeError(f"DataLoader: expected a braid.data.Dataset or (inputs, targets), got {type(dataset).__name__}")
        if "this" not in vars(dataset) and not isinstance(dataset, TensorDataset):
            _dataset_init(dataset)  # a Python Dataset whose __init__ did not call super().__init__()
        opts = _data.DataLoaderOptions()
        opts.batch_size, opts.shuffle, opts.drop_last, opts.seed = batch_size, shuffle, drop_last, seed
        opts.prefetch, opts.num_shards, opts.shard = prefetch, num_shards, shard
        vec = _data.TransformVector()  # appended one by one: SWIG converts each to shared_ptr<const Transform>
        for t in transforms:
            vec.append(t)
        opts.transforms = vec
        if device is not None:
            opts.set_device(_tensor.device(device))
        self.dataset = dataset  # keeps a Python dataset alive while C++ holds it
        self._loader = _data.DataLoader(dataset, opts)

    def __iter__(self):
        batch = _data.Batch()
        while self._loader.next(batch):
            yield batch.input, batch.target

    def __len__(self):
        return int(self._loader.num_batches())

    def __del__(self):
        # The C++ loader goes first: its destructor stops the prefetch thread (with the GIL
        # released), which may be calling the Python dataset that self.dataset keeps alive.
        loader = self.__dict__.pop("_loader", None)
        del loader

    def __getattr__(self, name):  # epoch, batch, seek, set_epoch, num_samples, batch_indices
        return getattr(self.__dict__["_loader"], name)
