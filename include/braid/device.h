// Device: where a tensor's storage lives and which backend runs its primitives. A plain value
// (type and index), parsed from the strings users write ("cpu", "cuda", "cuda:1", "shadow").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace braid {

/// CPU is host memory run by the OpenBLAS/OpenMP kernels; CUDA an NVIDIA GPU; Shadow a test device
/// that runs the CPU kernels on memory of its own and refuses host access and device mixes, so that
/// CI proves on machines without a GPU that no op assumes host memory (Note [The shadow device] in
/// src/backend/shadow/shadow_backend.cpp).
enum class DeviceType { CPU, CUDA, Shadow };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return Device{DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return Device{DeviceType::CUDA, index}; }
  static Device shadow(int index = 0) { return Device{DeviceType::Shadow, index}; }
  /// "cpu", "cuda", "cuda:1", "shadow", "shadow:0"; ValueError naming the string otherwise.
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  /// "cpu", "cuda:0", "shadow:0".
  std::string str() const;
};

inline Device cpu() { return Device::cpu(); }

/// The device that creation functions use when none is given: the CPU unless set_default_device
/// changed it (as torch.set_default_device). Library code never relies on it for constants: those
/// are made on their operand's device (Note [Implicit devices] in braid/ops.h).
Device default_device();
void set_default_device(Device device);

/// Whether device exists in this process (compiled in, and for CUDA an index below device_count).
bool device_available(Device device);
/// Devices of a type in this process: 1 for the CPU, the GPU count for CUDA (0 when CUDA is not
/// compiled in or no GPU is visible), 2 for the shadow device.
int device_count(DeviceType type);
/// Waits for every queued operation on device (a no-op on the CPU).
void synchronize(Device device = Device::cpu());

namespace detail {
struct BackendEvent;
}

/// A point in a device's queue of work, as torch.cuda.Event(enable_timing=True): record() marks
/// the end of what is queued now; synchronize() waits for it; elapsed_ms gives the device time
/// between two events without stopping the host in between. On devices that run each op before
/// returning (the CPU, the shadow device) an event is a timestamp taken when it is recorded.
class Event {
 public:
  static Event record(Device device = Device::cpu());
  Device device() const { return device_; }
  /// Whether the work before the event has finished.
  bool ready() const;
  void synchronize() const;
  /// Milliseconds from this event to end (recorded later on the same device); waits for end.
  double elapsed_ms(const Event& end) const;

 private:
  Event(Device device, std::shared_ptr<detail::BackendEvent> impl) : device_(device), impl_(std::move(impl)) {}
  Device device_;
  std::shared_ptr<detail::BackendEvent> impl_;
};

/// The precision of float32 matrix products, as torch.set_float32_matmul_precision: "highest"
/// (float32 operands and sums, the default), "high" or "medium" (a CUDA device may round the
/// operands to TF32, 10 bits of mantissa, and sum in float32: CUBLAS_COMPUTE_32F_FAST_TF32; both
/// mean that on CUDA). The CPU backend computes float32 products in float32 whatever the setting.
/// Process-wide; the default is the knob BRAID_FLOAT32_MATMUL_PRECISION. Any other value is a
/// ValueError naming it and the choices.
void set_float32_matmul_precision(const std::string& precision);
std::string float32_matmul_precision();

/// Bytes held by live tensors on device, the most since the last reset_peak_memory_stats, and the
/// bytes its allocator keeps cached for reuse (as torch.cuda.memory_allocated and friends).
int64_t memory_allocated(Device device = Device::cpu());
int64_t max_memory_allocated(Device device = Device::cpu());
int64_t memory_cached(Device device = Device::cpu());
void reset_peak_memory_stats(Device device = Device::cpu());
/// Returns device's cached blocks to the system (or the driver).
void empty_cache(Device device = Device::cpu());

/// Whether cuDNN's convolutions time every candidate algorithm on the first use of each geometry
/// and keep the fastest (as torch.backends.cudnn.benchmark), rather than take the first choice of
/// cuDNN's heuristics (the default, or BRAID_CUDNN_BENCHMARK=1). Plans already made are kept.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

}  // namespace braid
