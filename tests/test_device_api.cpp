// The device API: parsing, transfers, device mixes and host access refused with clear errors,
// gradients crossing devices, Module::to, memory statistics. Runs on the CPU and, in the shadow pass,
// with the shadow device as the default (tests/test_device.h); the explicit devices below are the
// shadow device's, which every build has.
#include <gtest/gtest.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_backend.h"  // no CUDA type: which primitives CudaBackend declares
#include "backend/shadow/shadow_backend.h"
#include "braid/braid.h"
#include "braid/nn/nn.h"
#include "error_of.h"
#include "test_device.h"

namespace braid {
namespace {

const Device kShadow = Device::shadow(0);

TEST(Device, ParsesWhatUsersWrite) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cpu:0"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("shadow:1"), Device::shadow(1));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_NE(error_of<ValueError>([] { Device::parse("gpu"); }).find("unknown device 'gpu'; known: cpu, cuda"),
            std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { Device::parse("cuda:x"); }).find("invalid index in 'cuda:x'"), std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { Device::parse("cuda:-1"); }).find("invalid index"), std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { Device::parse("cpu:1"); }).find("cpu:0"), std::string::npos);
}

TEST(Device, CountsAndAvailability) {
  EXPECT_EQ(device_count(DeviceType::CPU), 1);
  EXPECT_EQ(device_count(DeviceType::Shadow), 2);
  EXPECT_TRUE(device_available(Device::shadow(1)));
  EXPECT_FALSE(device_available(Device::shadow(2)));
  EXPECT_NE(error_of<NotImplementedError>([] { zeros({2}, kFloat32, Device::shadow(5)); }).find("shadow:5"),
            std::string::npos);
}

TEST(Device, TransfersKeepValuesLayoutAndDtype) {
  Tensor x = tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, Device::cpu());
  Tensor s = x.mT().to(kShadow);  // a strided view travels as its values
  EXPECT_EQ(s.device(), kShadow);
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor back = s.to(Device::shadow(1)).cpu();  // device to device, then home
  EXPECT_EQ(back.device(), Device::cpu());
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(s.to(kShadow).is_same(s));  // already there: the same tensor, as PyTorch
  Tensor h = tensor(std::vector<int64_t>{7, -8}, {2}, kShadow).to(kFloat16);
  EXPECT_EQ(h.cpu().to(kFloat32).to_vector<float>(), (std::vector<float>{7, -8}));
  EXPECT_DOUBLE_EQ(scalar_tensor(2.5, kFloat64, kShadow).item(), 2.5);
}

// Page-locked host memory for a device's transfers (the MPI group's staging buffers): a CPU tensor,
// written and read like any other, through which values cross to the device and back. The shadow
// device hands out counted blocks, so the test sees them asked for and given back; the CPU has
// none, and empty_pinned gives ordinary memory there.
TEST(Device, PinnedHostMemoryCarriesTransfers) {
  for (Device d : {test::test_device(), kShadow}) {
    Tensor h = empty_pinned({3, 5}, kFloat32, d);
    EXPECT_EQ(h.device(), Device::cpu());
    EXPECT_EQ(h.shape(), (Shape{3, 5}));
    std::vector<float> expected(15);
    for (int i = 0; i < 15; ++i) h.data<float>()[i] = expected[i] = 0.5f * static_cast<float>(i) - 3.0f;
    Tensor x = h.to(d);
    EXPECT_EQ(x.device(), d);
    Tensor back = empty_pinned({3, 5}, kFloat32, d);
    back.copy_(x * 2.0);
    for (float& v : expected) v *= 2.0f;
    EXPECT_EQ(back.to_vector<float>(), expected) << d.str();
  }
  const int64_t made = detail::shadow_pinned_allocations(), live = detail::shadow_pinned_live();
  {
    Tensor h = empty_pinned({64}, kFloat64, kShadow);
    EXPECT_EQ(detail::shadow_pinned_allocations(), made + 1);
    EXPECT_EQ(detail::shadow_pinned_live(), live + 1);
    Tensor view = h.slice(0, 8, 16);  // a view keeps the block
    h = Tensor();
    EXPECT_EQ(detail::shadow_pinned_live(), live + 1);
  }
  EXPECT_EQ(detail::shadow_pinned_live(), live);
  EXPECT_EQ(empty_pinned({4}, kInt64, Device::cpu()).numel(), 4);
  EXPECT_EQ(detail::shadow_pinned_allocations(), made + 1);  // the CPU asked the shadow device for nothing
  EXPECT_EQ(empty_pinned({0, 3}, kFloat32, kShadow).numel(), 0);
}

TEST(Device, HostAccessToDeviceMemoryIsRefused) {
  Tensor s = ones({2}, kFloat32, kShadow);
  EXPECT_NE(error_of<TypeError>([&] { (void)s.data<float>(); }).find("raw_data: the tensor is on shadow:0"),
            std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { (void)s.raw_data(); }).find(".cpu()"), std::string::npos);
  // The explicit copies are allowed.
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_NE(s.to_string().find("device=shadow:0"), std::string::npos);
}

TEST(Device, MixingDevicesIsRefusedNamingTheOp) {
  Tensor a = ones({2}, kFloat32, kShadow), b = ones({2}, kFloat32, Device::cpu());
  EXPECT_NE(error_of<TypeError>([&] { (void)add(a, b); }).find("add: tensors are on different devices (shadow:0 and cpu)"),
            std::string::npos);
  Tensor c = ones({2}, kFloat32, Device::shadow(1));
  EXPECT_NE(error_of<TypeError>([&] { (void)mul(a, c); }).find("shadow:0 and shadow:1"), std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { (void)matmul(ones({2, 2}, kFloat32, kShadow), ones({2, 2}, kFloat32, Device::cpu())); }).find("matmul"),
            std::string::npos);
}

TEST(Device, CopyAcrossDevicesAndConstantsFollowTheOperand) {
  Tensor s = zeros({3}, kFloat64, kShadow);
  s.copy_(tensor(std::vector<double>{1, 2, 3}, {3}, Device::cpu()));
  EXPECT_EQ(s.device(), kShadow);
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{1, 2, 3}));
  // Scalars, clamp bounds, pow exponents and backward constants are made on the operand's device.
  Tensor y = clamp(pow(s * 2.0 + 1.0, 2.0), 0.0, 30.0);
  EXPECT_EQ(y.device(), kShadow);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{9, 25, 30}));
}

TEST(Device, GradientsFlowBackToTheSourceDevice) {
  // y = sum(relu(x_on_shadow) * 3): dy/dx = 3 where x > 0, else 0, delivered on the CPU.
  Tensor x = tensor(std::vector<double>{-1, 2, 0.5}, {3}, Device::cpu()).set_requires_grad();
  Tensor y = sum(relu(x.to(kShadow)) * 3.0);
  EXPECT_EQ(y.device(), kShadow);
  y.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), Device::cpu());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 3, 3}));
}

TEST(Device, ModuleToMovesParametersBuffersAndGradsInPlace) {
  manual_seed(3);
  nn::Sequential m;
  m.add(std::make_shared<nn::Linear>(3, 2));
  m.add(std::make_shared<nn::BatchNorm1d>(2));
  m.to(Device::cpu());
  std::vector<Tensor> params = m.parameters();
  const std::vector<float> w = params[0].cpu().to_vector<float>();
  Tensor x = randn({4, 3}, kFloat32, nullptr, 0.0, 1.0, Device::cpu());
  sum(m.forward(x)).backward();
  m.to(kShadow);
  EXPECT_EQ(m.device(), kShadow);
  for (const auto& [name, t] : m.named_buffers()) EXPECT_EQ(t.device(), kShadow) << name;
  // The handles taken before the move see the moved tensors (optimizers hold such handles).
  EXPECT_EQ(params[0].device(), kShadow);
  EXPECT_EQ(params[0].to_vector<float>(), w);
  EXPECT_EQ(params[0].grad().device(), kShadow);
  Tensor out = m.forward(x.to(kShadow));
  EXPECT_EQ(out.device(), kShadow);
  m.to(Device::cpu());
  EXPECT_EQ(params[0].device(), Device::cpu());
}

TEST(Device, MemoryStatisticsPerDevice) {
  reset_peak_memory_stats(kShadow);
  const int64_t before = memory_allocated(kShadow);
  {
    Tensor a = empty({1000}, kFloat32, kShadow);  // 4000 bytes, 4032 rounded to 64
    EXPECT_EQ(memory_allocated(kShadow) - before, 4032);
    Tensor b = empty({10}, kFloat64, kShadow);  // 80 -> 128
    EXPECT_EQ(memory_allocated(kShadow) - before, 4160);
  }
  EXPECT_EQ(memory_allocated(kShadow), before);
  EXPECT_EQ(max_memory_allocated(kShadow) - before, 4160);
  reset_peak_memory_stats(kShadow);
  EXPECT_EQ(max_memory_allocated(kShadow), before);
}

// Note [Block cache]: freed large CPU blocks are reused (a request is served by a cached block of
// up to twice its size), and what the cache keeps is bounded by the peak of live tensor bytes, so
// a run through many sizes does not keep one block of each resident.
TEST(Device, CpuBlockCacheReusesBlocksAndStaysBoundedByTheLivePeak) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "address-sanitizer builds keep no block cache, so that use-after-free is caught (Note [Block cache])";
#endif
  const Device cpu = Device::cpu();
  empty_cache(cpu);
  reset_peak_memory_stats(cpu);
  void* first = nullptr;
  {
    Tensor a = empty({1 << 20}, kFloat32, cpu);  // 4 MiB
    first = a.raw_data();
  }
  EXPECT_GE(memory_cached(cpu), 4 << 20);
  {
    Tensor b = empty({(1 << 20) - 4096}, kFloat32, cpu);  // a little smaller: served by the same block
    EXPECT_EQ(b.raw_data(), first);
  }
  // 64 sizes from 1 to 64 MiB, one alive at a time: the cache keeps at most max(64 MiB, 3 x peak).
  for (int64_t mib = 1; mib <= 64; ++mib) Tensor t = empty({mib << 18}, kFloat32, cpu);
  const int64_t peak = max_memory_allocated(cpu);
  EXPECT_LE(memory_cached(cpu), std::max<int64_t>(int64_t{64} << 20, 3 * peak));
  EXPECT_LT(memory_cached(cpu), int64_t{64 * 65 / 2} << 20);  // not every block ever freed
  empty_cache(cpu);
  EXPECT_EQ(memory_cached(cpu), 0);
}

std::atomic<int> g_signals_seen{0};
extern "C" void count_signal(int) { g_signals_seen.fetch_add(1, std::memory_order_relaxed); }

// Note [Signals and oneDNN's kernels]: a thread that handles signals all the while it runs float32
// GEMMs and convolutions (oneDNN's kernels, where it is built in) keeps an intact heap and exact
// results. Without the guard this aborted within a few hundred products ("corrupted size vs.
// prev_size": the handler's frame written over the heap).
TEST(Device, SignalsDuringKernelsLeaveTheHeapAndTheResultsIntact) {
  struct sigaction counting = {};
  struct sigaction before = {};
  counting.sa_handler = count_signal;
  sigemptyset(&counting.sa_mask);
  counting.sa_flags = SA_RESTART;
  ASSERT_EQ(sigaction(SIGUSR2, &counting, &before), 0);
  manual_seed(5);
  const Tensor a = randn({64, 256}), b = randn({256, 512});
  const Tensor x = randn({2, 8, 16, 16}), w = randn({16, 8, 3, 3});
  const Tensor product = matmul(a.to(kFloat64), b.to(kFloat64));
  const Tensor convolved = conv2d(x.to(kFloat64), w.to(kFloat64), Tensor(), {1, 1}, {1, 1});
  std::atomic<bool> stop{false};
  const pthread_t target = pthread_self();
  std::thread sender([&] {
    while (!stop.load()) {
      pthread_kill(target, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  double worst = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<Tensor> small;  // heap chunks beside the kernels' workspaces
    for (int64_t j = 0; j < 4; ++j) small.push_back(full({50 + 40 * j}, 1.0));
    worst = std::max(worst, amax(abs(matmul(a, b).to(kFloat64) - product)).item());
    if (i % 8 == 0)
      worst = std::max(worst, amax(abs(conv2d(x, w, Tensor(), {1, 1}, {1, 1}).to(kFloat64) - convolved)).item());
  }
  stop = true;
  sender.join();
  sigaction(SIGUSR2, &before, nullptr);
  EXPECT_GT(g_signals_seen.load(), 0);
  EXPECT_LT(worst, 1e-3);  // float32 sums of 256 and 72 products of unit normals
}

// Note [The shadow device's capability set]: under BRAID_SHADOW_CAPS=cuda the shadow backend declines
// each optional primitive that CudaBackend does not declare, and the op then composes its result from
// the required primitives, as on a GPU; otherwise it runs the CPU's kernel. The op's value is the
// same either way (the composite is the primitive's definition).
TEST(Device, TheShadowDeviceOffersTheCapabilitySetItRunsWith) {
  const char* caps = std::getenv("BRAID_SHADOW_CAPS");
  const bool as_cuda = caps != nullptr && std::string(caps) == "cuda";
  constexpr bool cuda_softmax =
      !std::is_same_v<decltype(&detail::CudaBackend::softmax_rows), decltype(&detail::FusedKernels::softmax_rows)>;
  constexpr bool cuda_moments =
      !std::is_same_v<decltype(&detail::CudaBackend::channel_moments), decltype(&detail::FusedKernels::channel_moments)>;
  manual_seed(3);
  const Tensor x = randn({5, 7}).cpu();
  const Tensor xs = x.to(kShadow);
  Tensor out = empty({5, 7}, kFloat32, kShadow);
  const bool ran = detail::shadow_backend().fused().softmax_rows(xs, out);
  EXPECT_EQ(ran, as_cuda ? cuda_softmax : true) << "BRAID_SHADOW_CAPS=" << (caps ? caps : "(unset)");
  if (ran) {
    EXPECT_TRUE(allclose(out.cpu(), softmax(x, -1), 1e-6, 1e-7));
  }
  EXPECT_TRUE(allclose(softmax(xs, -1).cpu(), softmax(x, -1), 1e-6, 1e-7));

  const Tensor y = randn({3, 4, 5}).to(kShadow);
  Tensor mean = empty({4}, kFloat32, kShadow), var = empty({4}, kFloat32, kShadow);
  const bool moments = detail::shadow_backend().fused().channel_moments(y, mean, var);
  EXPECT_EQ(moments, as_cuda ? cuda_moments : true);
  if (moments) {
    const Tensor yc = y.cpu();
    EXPECT_TRUE(allclose(mean.cpu(), braid::mean(yc, {0, 2}), 1e-5, 1e-6));
    EXPECT_TRUE(allclose(var.cpu(), braid::var(yc, {0, 2}, 0), 1e-5, 1e-6));
  }
}

TEST(Device, DefaultDeviceIsWhatTheRunTests) {
  EXPECT_EQ(default_device(), test::test_device());
  EXPECT_EQ(zeros({1}).device(), test::test_device());
  EXPECT_EQ(arange(3).device(), test::test_device());
  EXPECT_EQ(nn::Linear(2, 2).weight().device(), test::test_device());
}


TEST(Device, EventsOrderWorkAndMeasureBetweenThem) {
  // Elapsed times are checked for their order, not their size: a later event is never earlier, an
  // event is 0 ms from itself, and the span over a piece of work contains its sub-spans.
  for (Device d : {Device::cpu(), Device::shadow()}) {
    Tensor a = randn({64, 64}, kFloat32, nullptr, 0.0, 1.0, d);
    Event start = Event::record(d);
    Tensor b = matmul(a, a);
    Event middle = Event::record(d);
    Tensor c = matmul(b, a);
    Event end = Event::record(d);
    end.synchronize();
    EXPECT_TRUE(end.ready());
    EXPECT_EQ(start.device(), d);
    EXPECT_EQ(start.elapsed_ms(start), 0.0);
    const double first = start.elapsed_ms(middle), all = start.elapsed_ms(end), second = middle.elapsed_ms(end);
    EXPECT_GE(first, 0.0);
    EXPECT_GE(second, 0.0);
    EXPECT_GE(all, first);
    EXPECT_NEAR(all, first + second, 1e-9 * std::max(all, 1.0));
    EXPECT_LE(end.elapsed_ms(start), 0.0);
  }
  Event on_cpu = Event::record(Device::cpu());
  Event on_shadow = Event::record(Device::shadow());
  EXPECT_EQ(error_of<TypeError>([&] { on_cpu.elapsed_ms(on_shadow); }),
            "Event::elapsed_ms: the events are on different devices (cpu and shadow:0)");
  EXPECT_THROW(Event::record(Device::cuda(7)), NotImplementedError);
}

TEST(Device, Float32MatmulPrecisionIsSetAndCheckedAndTheCpuIgnoresIt) {
  EXPECT_EQ(float32_matmul_precision(), "highest");  // BRAID_FLOAT32_MATMUL_PRECISION's default
  // 1 + 2^-12 and 1 + 3 * 2^-12 are not TF32 numbers: a product that rounded its operands would
  // differ from the float32 one, which is exact here (small whole numbers times 12-bit fractions).
  const std::vector<float> av = {1 + 0x1p-12f, 1 + 3 * 0x1p-12f, 1, 1 + 0x1p-12f, 1, 1 + 3 * 0x1p-12f};
  const std::vector<float> bv = {1, 2, 3, 2, 3, 1};
  const Tensor a = tensor(av, {2, 3}), b = tensor(bv, {3, 2});
  const std::vector<float> exact = {static_cast<float>(av[0] * 1.0 + av[1] * 3.0 + av[2] * 3.0),
                                    static_cast<float>(av[0] * 2.0 + av[1] * 2.0 + av[2] * 1.0),
                                    static_cast<float>(av[3] * 1.0 + av[4] * 3.0 + av[5] * 3.0),
                                    static_cast<float>(av[3] * 2.0 + av[4] * 2.0 + av[5] * 1.0)};
  for (const char* p : {"high", "medium", "highest"}) {
    set_float32_matmul_precision(p);
    EXPECT_EQ(float32_matmul_precision(), p);
    EXPECT_EQ(matmul(a, b).cpu().to_vector<float>(), exact) << p;
  }
  for (const char* bad : {"fast", "", "High", "tf32"}) {
    const std::string msg = error_of<ValueError>([&] { set_float32_matmul_precision(bad); });
    EXPECT_NE(msg.find(std::string("set_float32_matmul_precision: '") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected highest, high or medium"), std::string::npos) << msg;
  }
  EXPECT_EQ(float32_matmul_precision(), "highest");  // a refused value changes nothing
}

}  // namespace
}  // namespace braid
