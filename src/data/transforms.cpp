// Image transforms over a batch (N, C, H, W), written with tensor ops so that they run on any
// backend. Random ones take their per-sample uniforms from one rand() call (see transforms.h).
#include "braid/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "braid/ops.h"

namespace braid::data {
namespace {

void check_images(const Tensor& x, const std::string& who) {
  BRAID_CHECK(x.dim() == 4, who, ": expected a batch of images (N, C, H, W), got shape ", shape_str(x.shape()));
}

std::string list_str(const std::vector<double>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// An integer uniform on [0, n) from a uniform on [0, 1); the min guards against rounding up to n.
int64_t scale(double u, int64_t n) { return std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(n)), n - 1); }

}  // namespace

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  BRAID_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: expected as many means as stds (at least one), got ",
              mean_.size(), " and ", std_.size());
  for (double s : std_) BRAID_CHECK(s > 0, "Normalize: every std must be positive, got ", list_str(std_));
}

Tensor Normalize::apply(const Tensor& x, Generator&) const {
  check_images(x, describe());
  const int64_t c = static_cast<int64_t>(mean_.size());
  BRAID_CHECK(c == 1 || c == x.size(1), describe(), ": ", c, " values for ", x.size(1), " channels (shape ",
              shape_str(x.shape()), ")");
  BRAID_CHECK_T(TypeError, is_floating(x.dtype()), describe(), ": expected floating images, got ", dtype_name(x.dtype()));
  Tensor m = tensor(mean_, {1, c, 1, 1}, x.device()).to(x.dtype());
  Tensor s = tensor(std_, {1, c, 1, 1}, x.device()).to(x.dtype());
  return (x - m) / s;
}

std::string Normalize::describe() const { return "Normalize(mean=" + list_str(mean_) + ", std=" + list_str(std_) + ")"; }

RandomCrop::RandomCrop(int64_t size, int64_t padding) : size_(size), padding_(padding) {
  BRAID_CHECK(size >= 1 && padding >= 0, "RandomCrop: expected size >= 1 and padding >= 0, got size ", size,
              " and padding ", padding);
}

Tensor RandomCrop::apply(const Tensor& x, Generator& gen) const {
  check_images(x, describe());
  const int64_t n = x.size(0), rows = x.size(2) + 2 * padding_ - size_ + 1, cols = x.size(3) + 2 * padding_ - size_ + 1;
  BRAID_CHECK(rows >= 1 && cols >= 1, describe(), ": images of shape ", shape_str(x.shape()),
              " padded by ", padding_, " are smaller than the crop");
  const Tensor padded = padding_ > 0 ? pad(x, {padding_, padding_, padding_, padding_}) : x;
  const std::vector<double> u = rand({n, 2}, kFloat64, &gen).to_vector<double>();
  std::vector<Tensor> crops;
  crops.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    crops.push_back(padded.select(0, i).narrow(1, scale(u[2 * i], rows), size_).narrow(2, scale(u[2 * i + 1], cols), size_));
  return stack(crops, 0);
}

std::string RandomCrop::describe() const {
  return "RandomCrop(size=" + std::to_string(size_) + ", padding=" + std::to_string(padding_) + ")";
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  BRAID_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::apply(const Tensor& x, Generator& gen) const {
  check_images(x, describe());
  const int64_t n = x.size(0), w = x.size(3);
  const Tensor u = rand({n}, kFloat64, &gen, 0.0, 1.0, x.device());
  const Tensor flip = lt(u, scalar_like(u, p_)).reshape({n, 1, 1, 1});
  const Tensor mirrored = index_select(x, 3, arange(static_cast<double>(w - 1), -1.0, -1.0, kInt64, x.device()));
  return where(flip, mirrored, x);
}

std::string RandomHorizontalFlip::describe() const {
  std::ostringstream os;
  os << "RandomHorizontalFlip(p=" << p_ << ")";
  return os.str();
}

}  // namespace braid::data
