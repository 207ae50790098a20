// CIFAR-10's binary version: files of 3073-byte records (a label byte, then the red, green and
// blue 32x32 planes), five training batches and one test batch.
#include <sys/stat.h>

#include <string>
#include <vector>

#include "braid/data/readers.h"
#include "braid/ops.h"
#include "data/input_file.h"

namespace braid::data {

using detail::file_error;

namespace {

constexpr int64_t kPixels = 3 * 32 * 32;
constexpr int64_t kRecord = 1 + kPixels;

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::shared_ptr<TensorDataset> load_cifar10(const std::string& dir, bool train) {
  std::vector<std::string> names;
  if (train)
    for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  else
    names.push_back("test_batch.bin");
  // The archive unpacks into cifar-10-batches-bin/; accept its parent too.
  std::string base = dir;
  if (!is_file(base + "/" + names[0]) && is_file(base + "/cifar-10-batches-bin/" + names[0]))
    base += "/cifar-10-batches-bin";

  std::vector<std::string> contents;
  int64_t total = 0;
  for (const std::string& name : names) {
    const std::string path = base + "/" + name;
    if (!is_file(path)) throw Error("load_cifar10: '" + path + "' does not exist");
    detail::InputFile in(path);
    std::string bytes = in.read_all();
    const int64_t n = static_cast<int64_t>(bytes.size());
    if (n == 0 || n % kRecord != 0)
      file_error(path, "size " + std::to_string(n) + " is not a positive multiple of the record size " +
                           std::to_string(kRecord) + " (truncated or not a CIFAR-10 binary batch)");
    for (int64_t r = 0; r < n / kRecord; ++r) {
      const auto label = static_cast<uint8_t>(bytes[r * kRecord]);
      if (label > 9) file_error(path, "label " + std::to_string(label) + " of record " + std::to_string(r) + " is not in 0..9");
    }
    total += n / kRecord;
    contents.push_back(std::move(bytes));
  }

  Tensor images = empty({total, 3, 32, 32}, kFloat32), labels = empty({total}, kInt64);
  float* img = images.data<float>();
  int64_t* lab = labels.data<int64_t>();
  int64_t row = 0;
  for (const std::string& bytes : contents) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    for (int64_t r = 0; r < static_cast<int64_t>(bytes.size()) / kRecord; ++r, ++row) {
      const uint8_t* rec = p + r * kRecord;
      lab[row] = rec[0];
      // value / 255 in float32, as torchvision's ToTensor.
      for (int64_t i = 0; i < kPixels; ++i) img[row * kPixels + i] = static_cast<float>(rec[1 + i]) / 255.0f;
    }
  }
  return std::make_shared<TensorDataset>(images, labels);
}

}  // namespace braid::data
