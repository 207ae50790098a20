// Readers for the on-disk formats people have their data in: MNIST's IDX (plain or gzipped),
// CIFAR-10's binary batches, NumPy's .npy and numeric CSV. Each validates magic numbers, sizes and
// truncation before trusting a header, never allocates more than the file can hold, and throws a
// braid::Error naming the file and the problem.
#pragma once

#include <memory>
#include <string>

#include "braid/data/dataset.h"
#include "braid/dtype.h"

namespace braid::data {

/// An IDX file of unsigned bytes (MNIST's format: magic 0x00000803 for (N, H, W) images, 0x00000801
/// for (N) labels), gzipped or not, as a tensor of dtype (int32, int64, float32 or float64) holding
/// the raw values 0..255.
Tensor read_idx(const std::string& path, DType dtype = kInt32);

/// MNIST or a drop-in (Fashion-MNIST, KMNIST) from dir, which holds train-images-idx3-ubyte and
/// train-labels-idx1-ubyte (train) or the t10k-* files, each optionally with ".gz". inputs are
/// float32 (N, 1, H, W) scaled to [0, 1] (value / 255, as torchvision's ToTensor), targets int64
/// labels 0..9.
std::shared_ptr<TensorDataset> load_mnist(const std::string& dir, bool train = true);

/// CIFAR-10's binary version from dir (or dir/cifar-10-batches-bin): data_batch_1.bin ..
/// data_batch_5.bin (train) or test_batch.bin, records of one label byte and 3072 pixel bytes
/// (R, G, B planes of 32x32). inputs float32 (N, 3, 32, 32) scaled to [0, 1], targets int64 0..9.
std::shared_ptr<TensorDataset> load_cifar10(const std::string& dir, bool train = true);

/// A NumPy .npy file (format versions 1 to 3) of dtype <f2, <f4, <f8, <i4, <i8, |u1 (read as int32)
/// or |b1, little-endian and in C order; Fortran order and other dtypes are refused with an error
/// naming them.
Tensor read_npy(const std::string& path);
/// Writes t as .npy version 1.0, byte for byte as numpy.save writes it. bfloat16 has no NumPy dtype
/// and is refused.
void write_npy(const std::string& path, const Tensor& t);

/// A CSV file of numbers (comma-separated, one row per line, every row the same length, optionally
/// gzipped) as a float32 (rows, columns) tensor. has_header skips the first line. A bad value gives
/// an error naming the file, line and column.
Tensor read_csv(const std::string& path, bool has_header = false);

}  // namespace braid::data
