"""braid.data: datasets, the DataLoader, transforms and readers (braid/data/*.h).

A Dataset written in Python defines __len__ and __getitem__ (returning (input, target), each a
Tensor, a NumPy array or a number), as in PyTorch; the DataLoader's background thread calls it
(taking the GIL), batches and shuffles with braid's deterministic sampler, and prefetches.

    loader = braid.data.DataLoader((x_array, y_array), batch_size=64, shuffle=True)
    for x, y in loader: ...

The DataLoader's keywords are DataLoaderOptions' fields: batch_size, shuffle, drop_last, seed,
prefetch, num_shards and shard (for data-parallel ranks), transforms, and device (batches are moved
there by the prefetch thread).
"""

from ._swig.data import (Dataset, TensorDataset, Example, DataLoader, DataLoaderOptions,  # noqa: F401
                         Normalize, RandomCrop, RandomHorizontalFlip, load_mnist, load_cifar10, read_idx, read_npy,
                         write_npy, read_csv)
