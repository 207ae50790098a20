// The NCCL process group (distributed/nccl_group.cpp) at a world of one, on a GPU: every
// collective and dtype against closed forms, the ordering against the compute stream, the
// compressed wire, the front door, and the watchdog's abort of a collective stuck behind a blocked
// stream; and point-to-point transfers of a rank to itself through NCCL's pair communicators (Note
// [NCCL point-to-point]), or staged through the host group where BRAID_NCCL_P2P=0 (the test
// nccl_p2p_staged_emulated). Without a GPU, or in a build without NCCL, every case skips with the reason. Two ranks on
// one GPU (NCCL refuses them, so CUDA tensors are staged through MPI) run the distributed suites
// with BRAID_TEST_DEVICE=cuda under mpiexec: scripts/gpu_check.sh.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "backend/cuda/runtime.h"
#include "braid/braid.h"
#include "braid/config.h"
#include "braid/distributed.h"
#include "core/knob_read.h"
#include "error_of.h"

namespace braid {
namespace {

using distributed::ReduceOp;
const Device kCuda = Device::cuda(0);

#define REQUIRE_NCCL_GROUP(g)                                                                              \
  if (!device_available(kCuda))                                                                            \
    GTEST_SKIP() << "no CUDA device: device_count(DeviceType::CUDA) is " << device_count(DeviceType::CUDA) \
                 << " (no GPU or no driver visible to this process)";                                      \
  auto g = distributed::native_group(distributed::world(), kCuda);                                         \
  if (!g) GTEST_SKIP() << "no NCCL group: " << (kHaveNccl ? "BRAID_NCCL=0 is set" : "built without NCCL")

#ifdef BRAID_HAVE_NCCL
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

// Values exact in every dtype below (small integers), written on the device just before the
// collective so that a collective that does not wait for the compute stream reads stale memory.
Tensor written_on_device(DType dtype, int64_t n) {
  const bool is_unsigned = dtype == kUInt8;
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i % 7) - (is_unsigned ? 0 : 3);
  Tensor t = zeros({n}, dtype, kCuda);
  t.copy_(tensor(values, {n}, kCuda).to(dtype));  // a cast on the device's stream
  return t;
}

std::vector<double> host(const Tensor& t) { return t.to(kFloat64).to_vector<double>(); }

TEST(NcclWorldOfOne, EveryCollectiveAndDtypeAgainstClosedForms) {
  REQUIRE_NCCL_GROUP(g);
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->rank(), 0);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kInt8, kUInt8}) {
    for (int64_t n : {1, 1000, 1 << 20}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " x " + std::to_string(n));
      const Tensor want = written_on_device(dt, n);
      const std::vector<double> expect = host(want);
      // The front door's rules, as on the MPI path: no average of integers, no max or min of halves.
      const bool half = dt == kFloat16 || dt == kBFloat16;
      std::vector<ReduceOp> ops = {ReduceOp::Sum};
      if (is_floating(dt)) ops.push_back(ReduceOp::Average);
      if (!half) ops.insert(ops.end(), {ReduceOp::Max, ReduceOp::Min});
      for (ReduceOp op : ops) {
        Tensor t = written_on_device(dt, n);
        g->all_reduce_async(t, op)->wait();  // a world of one: every reduction is the value itself
        EXPECT_EQ(host(t), expect) << distributed::reduce_op_name(op);
      }
      Tensor b = written_on_device(dt, n);
      g->broadcast(b, 0);
      EXPECT_EQ(host(b), expect);
      Tensor gathered = g->all_gather(written_on_device(dt, n));
      EXPECT_EQ(gathered.shape(), (Shape{1, n}));
      EXPECT_EQ(host(gathered.reshape({n})), expect);
      Tensor scattered = g->reduce_scatter(written_on_device(dt, n), ReduceOp::Sum);
      EXPECT_EQ(scattered.shape(), (Shape{n}));
      EXPECT_EQ(host(scattered), expect);
    }
  }
  g->barrier();
}

TEST(NcclWorldOfOne, CompressedWireRoundsLikeACastAndDeterministicModeIsExact) {
  REQUIRE_NCCL_GROUP(g);
  // 1 + k/4096 is not a float16 or bfloat16 number for most k: the result is the rounded value.
  Tensor x = arange(0, 4096, 1.0, kFloat32, kCuda) / 4096.0 + 1.0;
  for (auto [wire, dt] : {std::pair{distributed::WireDType::Float16, kFloat16},
                          std::pair{distributed::WireDType::BFloat16, kBFloat16}}) {
    Tensor t = x.clone();
    distributed::AllReduceOptions o;
    o.wire_dtype = wire;
    g->all_reduce_async(t, ReduceOp::Sum, o)->wait();
    EXPECT_EQ(host(t), host(x.to(dt).to(kFloat32)));
  }
  Tensor t = x.clone();
  distributed::AllReduceOptions o;
  o.deterministic = true;
  g->all_reduce(t, ReduceOp::Average, o);
  EXPECT_EQ(host(t), host(x));
}

TEST(NcclWorldOfOne, FrontDoorErrorsNameTheOpAndTheDevice) {
  REQUIRE_NCCL_GROUP(g);
  EXPECT_NE(error_of([&] { g->all_reduce(zeros({4}, kFloat32, Device::cpu())); }).find("cpu"), std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { g->all_reduce(zeros({4}, kBool, kCuda)); }).find("bool"), std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { g->all_reduce(zeros({4}, kInt32, kCuda), ReduceOp::Average); }).find("average"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g->reduce_scatter(zeros(Shape{}, kFloat32, kCuda)); }).find("leading axis"),
            std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { g->broadcast(zeros({3}, kFloat32, kCuda), 1); }).find("rank 1"),
            std::string::npos);
}

// A host function blocks the backend's compute stream until the test releases it; the collective queued
// behind it cannot start, its deadline passes, and the watchdog aborts the communicator. The error
// names the rank, the op and its sequence number, as the MPI path's does.
std::atomic<bool> g_release{false};
void CUDART_CB block_stream(void*) {
  while (!g_release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(NcclWorldOfOne, WatchdogAbortsACollectiveStuckBehindABlockedStream) {
  REQUIRE_NCCL_GROUP(g);
  distributed::set_timeout(1.0);
  Tensor t = ones({1024}, kFloat32, kCuda);
  g->all_reduce(t);  // #1 completes
  g_release = false;
  ASSERT_EQ(cudaLaunchHostFunc(detail::cuda::stream(0), block_stream, nullptr), cudaSuccess);
  const std::string msg = error_of<DistributedError>([&] { g->all_reduce_async(t)->wait(); });
  g_release = true;
  ASSERT_EQ(cudaStreamSynchronize(detail::cuda::stream(0)), cudaSuccess);
  distributed::set_timeout(600);
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all_reduce(sum, 1024 float32) #2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not complete within 1 s"), std::string::npos) << msg;
  // The aborted group refuses further work with the same message.
  EXPECT_NE(error_of<DistributedError>([&] { g->all_reduce(t); }).find("#2"), std::string::npos);
}

// A rank's transfers to itself, sent with interleaved tags and received in another order: some
// receives are posted before their sends (they wait for the announcement), the others after (the
// transfer waits in a buffer of its own); each tag's transfers arrive in the order they were sent.
TEST(NcclPointToPoint, ToSelfMatchesByTagNotByCallOrder) {
  REQUIRE_NCCL_GROUP(g);
  if (!detail::knob_flag("BRAID_NCCL_P2P")) GTEST_SKIP() << "BRAID_NCCL_P2P=0: transfers are staged";
  struct Transfer {
    int tag;
    Tensor sent;
  };
  // Tags 3, 5, 3, 9, 5 (two transfers each for 3 and 5), dtypes and shapes of their own.
  std::vector<Transfer> sends = {
      {3, written_on_device(kFloat32, 6).reshape({2, 3})}, {5, written_on_device(kInt64, 4)},
      {3, written_on_device(kFloat32, 6).reshape({2, 3}) * 2.0}, {9, written_on_device(kBFloat16, 1000)},
      {5, written_on_device(kInt64, 4) + 10}};
  // Posted first: the second transfer of tag 5 is wanted before the first exists.
  Tensor nine = zeros({1000}, kBFloat16, kCuda);
  auto w_nine = g->irecv(nine, 0, 9);
  Tensor five_a = zeros({4}, kInt64, kCuda), five_b = zeros({4}, kInt64, kCuda);
  auto w_five_a = g->irecv(five_a, 0, 5);
  auto w_five_b = g->irecv(five_b, 0, 5);
  std::vector<distributed::WorkPtr> sent_works;
  for (const Transfer& t : sends) sent_works.push_back(g->isend(t.sent, 0, t.tag));
  // Posted after: both tag-3 transfers wait in buffers; the receive of the second comes first.
  Tensor three_a = zeros({2, 3}, kFloat32, kCuda), three_b = zeros({2, 3}, kFloat32, kCuda);
  auto w_three_a = g->irecv(three_a, 0, 3);
  auto w_three_b = g->irecv(three_b, 0, 3);
  for (auto& w : {w_three_b, w_nine, w_five_b, w_three_a, w_five_a}) w->wait();
  for (auto& w : sent_works) {
    w->wait();
    EXPECT_TRUE(w->is_completed());
  }
  EXPECT_EQ(host(three_a), host(sends[0].sent));
  EXPECT_EQ(host(three_b), host(sends[2].sent));
  EXPECT_EQ(host(five_a), host(sends[1].sent));
  EXPECT_EQ(host(five_b), host(sends[4].sent));
  EXPECT_EQ(host(nine), host(sends[3].sent));
  // The receive reads what the compute stream wrote just before the send, and its consumer sees it.
  Tensor x = written_on_device(kFloat64, 1 << 16);
  Tensor y = zeros({1 << 16}, kFloat64, kCuda);
  g->isend(x * 3.0, 0, 11);
  g->irecv(y, 0, 11)->wait();
  EXPECT_EQ(host(y - x * 3.0), std::vector<double>(1 << 16, 0.0));
}

// An irecv whose dtype or element count is not the announced transfer's fails, naming both ranks,
// the tag, and both shapes and dtypes; the transfer stays for a receive that matches it.
TEST(NcclPointToPoint, MismatchNamesRanksTagShapesAndDtypes) {
  REQUIRE_NCCL_GROUP(g);
  if (!detail::knob_flag("BRAID_NCCL_P2P")) GTEST_SKIP() << "BRAID_NCCL_P2P=0: transfers are staged";
  const Tensor sent = written_on_device(kFloat32, 6).reshape({2, 3});
  g->isend(sent, 0, 7);  // received into a buffer: no receive is posted yet
  const std::string early = error_of<DistributedError>([&] { g->irecv(zeros({3}, kFloat32, kCuda), 0, 7); });
  for (const char* part : {"rank 0", "tag 7", "float32 [3]", "float32 [2, 3]", "disagree on shape or dtype"})
    EXPECT_NE(early.find(part), std::string::npos) << part << " in: " << early;
  // A receive posted before the send: the mismatch shows at its wait.
  auto w = g->irecv(zeros({2, 3}, kFloat64, kCuda), 0, 8);
  g->isend(sent, 0, 8);
  const std::string late = error_of<DistributedError>([&] { w->wait(); });
  for (const char* part : {"tag 8", "float64 [2, 3]", "float32 [2, 3]"})
    EXPECT_NE(late.find(part), std::string::npos) << part << " in: " << late;
  // Both transfers are still there, in order, for receives that match them.
  for (int tag : {7, 8}) {
    Tensor r = zeros({6}, kFloat32, kCuda);
    g->irecv(r, 0, tag)->wait();
    EXPECT_EQ(host(r), host(sent.reshape({6})));
  }
}

// BRAID_NCCL_P2P=0 (meson test nccl_p2p_staged_emulated): the same transfers go through the host
// group, staged in host memory, and still match by tag.
TEST(NcclPointToPoint, StagedThroughTheHostGroupWhenTheKnobIsOff) {
  REQUIRE_NCCL_GROUP(g);
  if (detail::knob_flag("BRAID_NCCL_P2P")) GTEST_SKIP() << "run with BRAID_NCCL_P2P=0 (nccl_p2p_staged_emulated)";
  const Tensor a = written_on_device(kFloat32, 100), b = written_on_device(kInt32, 10);
  g->isend(a, 0, 1);
  g->isend(b, 0, 2);
  g->isend(a * 2.0, 0, 1);
  Tensor rb = zeros({10}, kInt32, kCuda), ra = zeros({100}, kFloat32, kCuda), ra2 = zeros({100}, kFloat32, kCuda);
  g->irecv(rb, 0, 2)->wait();
  g->irecv(ra, 0, 1)->wait();
  g->irecv(ra2, 0, 1)->wait();
  EXPECT_EQ(host(rb), host(b));
  EXPECT_EQ(host(ra), host(a));
  EXPECT_EQ(host(ra2), host(a * 2.0));
  const std::string msg = error_of<DistributedError>([&] { g->irecv(zeros({4}, kFloat32, kCuda), 0, 1)->wait(); });
  EXPECT_NE(msg.find("sent nothing with that tag"), std::string::npos) << msg;
}

}  // namespace
}  // namespace braid
