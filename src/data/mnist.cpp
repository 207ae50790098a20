// MNIST's IDX format (big-endian header: two zero bytes, a type code, the number of dimensions,
// then one 32-bit size per dimension; then the values) and the MNIST-style dataset loader.
#include <sys/stat.h>

#include <vector>

#include "braid/data/readers.h"
#include "braid/ops.h"
#include "data/input_file.h"

namespace braid::data {

using detail::file_error;
using detail::InputFile;

namespace {

template <typename T>
void convert_bytes(InputFile& in, T* out, uint64_t n) {
  std::vector<uint8_t> buf(std::min<uint64_t>(n, 1 << 20));
  for (uint64_t done = 0; done < n;) {
    const uint64_t chunk = std::min<uint64_t>(n - done, buf.size());
    in.read_exact(buf.data(), chunk, "values");
    for (uint64_t i = 0; i < chunk; ++i) out[done + i] = static_cast<T>(buf[i]);
    done += chunk;
  }
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// dir/name, else dir/name.gz.
std::string find_file(const std::string& dir, const std::string& name) {
  const std::string plain = dir + "/" + name;
  if (exists(plain)) return plain;
  if (exists(plain + ".gz")) return plain + ".gz";
  throw Error("load_mnist: neither '" + plain + "' nor '" + plain + ".gz' exists");
}

}  // namespace

Tensor read_idx(const std::string& path, DType dtype) {
  BRAID_CHECK_T(TypeError, dtype == kInt32 || dtype == kInt64 || dtype == kFloat32 || dtype == kFloat64,
                "read_idx: dtype must be int32, int64, float32 or float64, got ", dtype_name(dtype));
  InputFile in(path);
  uint8_t magic[4];
  in.read_exact(magic, 4, "the IDX magic number");
  if (magic[0] != 0 || magic[1] != 0)
    file_error(path, "not an IDX file: the magic number must start with two zero bytes, got " +
                         std::to_string(magic[0]) + " " + std::to_string(magic[1]));
  if (magic[2] != 0x08)
    throw NotImplementedError("'" + path + "': IDX type code " + std::to_string(magic[2]) +
                              " is not supported; only 8 (unsigned byte, MNIST's) is");
  const int ndim = magic[3];
  if (ndim < 1) file_error(path, "IDX file with 0 dimensions");
  std::vector<uint8_t> dims(4 * static_cast<size_t>(ndim));
  in.read_exact(dims.data(), dims.size(), "the IDX sizes");
  Shape shape;
  uint64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint64_t s = (uint64_t{dims[4 * d]} << 24) | (uint64_t{dims[4 * d + 1]} << 16) |
                       (uint64_t{dims[4 * d + 2]} << 8) | uint64_t{dims[4 * d + 3]};
    shape.push_back(static_cast<int64_t>(s));
    if (__builtin_mul_overflow(numel, s, &numel) || numel > in.max_bytes())
      file_error(path, "truncated or corrupt: the IDX header claims shape " + shape_str(shape) + (d + 1 < ndim ? "..." : "") +
                           ", more values than the file can hold (" + std::to_string(in.max_bytes()) + " bytes left)");
  }
  Tensor out = empty(shape, dtype);
  switch (dtype) {
    case DType::Int32: convert_bytes(in, out.data<int32_t>(), numel); break;
    case DType::Int64: convert_bytes(in, out.data<int64_t>(), numel); break;
    case DType::Float32: convert_bytes(in, out.data<float>(), numel); break;
    default: convert_bytes(in, out.data<double>(), numel); break;
  }
  in.expect_end("the " + std::to_string(numel) + " values of shape " + shape_str(shape));
  return out;
}

std::shared_ptr<TensorDataset> load_mnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string image_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  Tensor images = read_idx(image_path, kFloat32), labels = read_idx(label_path, kInt64);
  if (images.dim() != 3) file_error(image_path, "expected images (N, H, W), got shape " + shape_str(images.shape()));
  if (labels.dim() != 1) file_error(label_path, "expected labels (N), got shape " + shape_str(labels.shape()));
  if (labels.size(0) != images.size(0))
    file_error(label_path, std::to_string(labels.size(0)) + " labels for " + std::to_string(images.size(0)) +
                               " images in '" + image_path + "'");
  const int64_t* l = labels.data<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (l[i] > 9) file_error(label_path, "label " + std::to_string(l[i]) + " of example " + std::to_string(i) + " is not in 0..9");
  // value / 255 in float32, as torchvision's ToTensor, so the inputs are bitwise PyTorch's.
  Tensor inputs = (images / 255.0).reshape({images.size(0), 1, images.size(1), images.size(2)});
  return std::make_shared<TensorDataset>(inputs, labels);
}

}  // namespace braid::data
