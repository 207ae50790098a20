// Device values: parsing and printing, and the process-wide default device of creation functions.
#include <atomic>
#include <cstdlib>

#include "braid/device.h"
#include "braid/error.h"
#include "core/knob_read.h"

namespace braid {

namespace {
struct TypeName {
  DeviceType type;
  const char* name;
};
constexpr TypeName kTypes[] = {{DeviceType::CPU, "cpu"}, {DeviceType::CUDA, "cuda"}, {DeviceType::Shadow, "shadow"}};

std::atomic<Device>& default_slot() {
  static std::atomic<Device> d{Device::cpu()};
  return d;
}
constexpr const char* kPrecisions[] = {"highest", "high", "medium"};

int precision_index(const std::string& p, const char* what) {
  for (int i = 0; i < 3; ++i)
    if (p == kPrecisions[i]) return i;
  throw ValueError(detail::cat(what, ": '", p, "' is not a float32 matmul precision; expected highest, high or medium"));
}

// The setting's index in kPrecisions; the knob's value until set_float32_matmul_precision.
std::atomic<int>& precision_slot() {
  static std::atomic<int> slot{
      precision_index(detail::knob_text("BRAID_FLOAT32_MATMUL_PRECISION"), "BRAID_FLOAT32_MATMUL_PRECISION")};
  return slot;
}
}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  const int i = precision_index(precision, "set_float32_matmul_precision");
  precision_slot().store(i);
}

std::string float32_matmul_precision() { return kPrecisions[precision_slot().load()]; }

std::string Device::str() const {
  for (const TypeName& t : kTypes)
    if (t.type == type) return type == DeviceType::CPU ? "cpu" : std::string(t.name) + ":" + std::to_string(index);
  return "device?";
}

Device Device::parse(const std::string& s) {
  const size_t colon = s.find(':');
  const std::string name = s.substr(0, colon);
  for (const TypeName& t : kTypes) {
    if (name != t.name) continue;
    int index = 0;
    if (colon != std::string::npos) {
      const std::string digits = s.substr(colon + 1);
      char* end = nullptr;
      const long v = digits.empty() ? -1 : std::strtol(digits.c_str(), &end, 10);
      BRAID_CHECK(!digits.empty() && *end == '\0' && v >= 0 && v < 1024, "Device: invalid index in '", s,
                  "'; expected a non-negative integer, as in 'cuda:1'");
      index = static_cast<int>(v);
    }
    BRAID_CHECK(t.type != DeviceType::CPU || index == 0, "Device: '", s, "' names a CPU other than cpu:0");
    return Device{t.type, index};
  }
  throw ValueError(detail::cat("Device: unknown device '", s, "'; known: cpu, cuda, cuda:N, shadow, shadow:N"));
}

Device default_device() { return default_slot().load(); }

void set_default_device(Device device) {
  BRAID_CHECK_T(NotImplementedError, device_available(device), "set_default_device: ", device.str(),
                " is not available in this process (", device_count(device.type), " device(s) of its type)");
  default_slot().store(device);
}

}  // namespace braid
