// The routing of device tensors to a device's native group (Note [Native device groups] in
// distributed/staged_group.cpp), under mpiexec -n 2 and -n 4, with a native group for the shadow
// device registered by the test: a group that counts what reaches it and stages it. The NCCL group
// that libbraid_cuda.so registers for CUDA tensors is routed the same way; it runs on a GPU
// (tests/test_nccl.cpp). Expected values are closed forms in the rank and the world size.
#include <atomic>
#include <chrono>
#include <thread>

#include "braid/distributed.h"
#include "distributed/internal.h"
#include "mpi_test_main.h"

using namespace braid;
using namespace braid::distributed;
using braid::testing::DistTest;
using braid::testing::N;
using braid::testing::R;

namespace braid::detail {  // src/backend/shadow/shadow_backend.h
int64_t shadow_pinned_allocations();
int64_t shadow_pinned_live();
}  // namespace braid::detail

namespace {

const Device kShadow = Device::shadow(0);

std::atomic<int> g_made{0}, g_collectives{0};
bool g_decline = false;

/// Counts the collectives that reach it; stages them through the host group like the fallback.
class CountingGroup final : public ProcessGroup {
 public:
  explicit CountingGroup(const ProcessGroupPtr& host) : host_(host), staged_(distributed::detail::stage_device_tensors(host, false)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name() + " (counting)"; }
  int world_rank(int r) const override { return host_->world_rank(r); }
  WorkPtr all_reduce_async(Tensor t, ReduceOp op, const AllReduceOptions& o) override {
    ++g_collectives;
    return staged_->all_reduce_async(std::move(t), op, o);
  }
  void broadcast(Tensor t, int root) override {
    ++g_collectives;
    staged_->broadcast(std::move(t), root);
  }
  Tensor all_gather(const Tensor& t) override {
    ++g_collectives;
    return staged_->all_gather(t);
  }
  Tensor reduce_scatter(const Tensor& t, ReduceOp op) override {
    ++g_collectives;
    return staged_->reduce_scatter(t, op);
  }
  void barrier() override { staged_->barrier(); }
  WorkPtr isend(const Tensor&, int, int) override { throw DistributedError("isend reached the native group"); }
  WorkPtr irecv(Tensor, int, int) override { throw DistributedError("irecv reached the native group"); }
  std::shared_ptr<ProcessGroup> split(int, int) override { throw DistributedError("split reached the native group"); }

 private:
  ProcessGroupPtr host_, staged_;
};

ProcessGroupPtr make_counting(const ProcessGroupPtr& host, const Device& device) {
  EXPECT_EQ(device, kShadow);
  ++g_made;
  return g_decline ? nullptr : std::make_shared<CountingGroup>(host);
}

class NativeGroups : public DistTest {
 protected:
  void SetUp() override {
    if (N() == 1) GTEST_SKIP() << "a world of one routes nothing: its collectives are identities (run under mpiexec)";
    g_made = 0;
    g_collectives = 0;
    g_decline = false;
    distributed::detail::register_device_group(DeviceType::Shadow, &make_counting);
  }
  void TearDown() override {
    distributed::detail::register_device_group(DeviceType::Shadow, nullptr);
    if (N() > 1) DistTest::TearDown();
  }
};

// A fresh group (a split of the world) makes its native group at its first collective on a device
// tensor and sends every later collective of that device there; host tensors and point-to-point
// transfers stay on the host group.
TEST_F(NativeGroups, DeviceCollectivesGoToTheNativeGroupMadeOnFirstUse) {
  auto g = world()->split(0, R());
  const double sum = N() * (N() + 1) / 2.0;
  Tensor t = full({1000}, R() + 1.0, kFloat32, kShadow);
  g->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(g_made.load(), 1);
  EXPECT_EQ(g_collectives.load(), 1);
  EXPECT_EQ(amax(t).item(), sum);
  EXPECT_EQ(amin(t).item(), sum);

  Tensor a = full({8}, R() + 1.0, kFloat32, kShadow);
  g->all_reduce_async(a, ReduceOp::Max)->wait();
  EXPECT_EQ(amin(a).item(), N());
  Tensor b = full({3}, R() == 1 ? 7.0 : 0.0, kFloat32, kShadow);
  g->broadcast(b, 1);
  EXPECT_EQ(amin(b).item(), 7.0);
  Tensor gathered = g->all_gather(full({2}, static_cast<double>(R()), kFloat32, kShadow));
  EXPECT_EQ(gathered.shape(), (Shape{N(), 2}));
  EXPECT_EQ(gathered.device(), kShadow);
  EXPECT_EQ(gathered.select(0, N() - 1).to(Device::cpu()).to_vector<float>(), (std::vector<float>{N() - 1.0f, N() - 1.0f}));
  Tensor scattered = g->reduce_scatter(full({2 * N()}, 1.0, kFloat32, kShadow), ReduceOp::Sum);
  EXPECT_EQ(scattered.shape(), (Shape{2}));
  EXPECT_EQ(amin(scattered).item(), N());
  EXPECT_EQ(g_made.load(), 1);
  EXPECT_EQ(g_collectives.load(), 5);

  // Host tensors: the host group. Point-to-point: staged, not the native group.
  Tensor h = full({4}, 1.0, kFloat32);
  g->all_reduce(h, ReduceOp::Sum);
  EXPECT_EQ(amin(h).item(), N());
  const int right = (R() + 1) % N(), left = (R() + N() - 1) % N();
  Tensor in = zeros({5}, kFloat32, kShadow);
  auto r = g->irecv(in, left, 3);
  g->isend(full({5}, R() + 0.5, kFloat32, kShadow), right, 3)->wait();
  r->wait();
  EXPECT_EQ(amin(in).item(), left + 0.5);
  EXPECT_EQ(g_collectives.load(), 5);

  // A sub-group makes a native group of its own, over its own ranks.
  auto half = g->split(R() % 2, R());
  Tensor s = full({4}, 1.0, kFloat32, kShadow);
  half->all_reduce(s, ReduceOp::Sum);
  EXPECT_EQ(amin(s).item(), half->size());
  EXPECT_EQ(g_made.load(), 2);
  EXPECT_EQ(g_collectives.load(), 6);
}

// A factory that declines (NCCL with two ranks on one GPU) leaves the device's tensors staged,
// asked once per group, through the device's page-locked host memory (Note [Staging device
// tensors]): one block per staged operation, given back when it completes.
TEST_F(NativeGroups, ADecliningFactoryLeavesTheTensorsStaged) {
  g_decline = true;
  auto g = world()->split(0, R());
  const int64_t made = braid::detail::shadow_pinned_allocations(), live = braid::detail::shadow_pinned_live();
  for (int i = 0; i < 3; ++i) {
    Tensor t = full({100}, R() + 1.0, kFloat32, kShadow);
    g->all_reduce(t, ReduceOp::Sum);
    EXPECT_EQ(amin(t).item(), N() * (N() + 1) / 2.0);
  }
  Tensor u = full({7}, R() == 0 ? 5.0 : -1.0, kFloat32, kShadow);
  g->all_reduce_async(u, ReduceOp::Max)->wait();
  EXPECT_EQ(u.cpu().to_vector<float>(), std::vector<float>(7, 5.0f));
  if (R() == 0) g->send(full({3}, 9.0, kInt32, kShadow), 1, 4);
  if (R() == 1) {
    Tensor r = zeros({3}, kInt32, kShadow);
    g->recv(r, 0, 4);
    EXPECT_EQ(r.cpu().to_vector<int32_t>(), std::vector<int32_t>(3, 9));
  }
  EXPECT_EQ(braid::detail::shadow_pinned_allocations(), made + 4 + (R() <= 1 ? 1 : 0));
  // The group's communication thread may drop its reference to the last block just after it
  // signals completion: wait (up to 10 s) for the blocks to come back.
  for (int i = 0; i < 10000 && braid::detail::shadow_pinned_live() != live; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(braid::detail::shadow_pinned_live(), live);
  EXPECT_EQ(g_made.load(), 1);
  EXPECT_EQ(g_collectives.load(), 0);
}

}  // namespace
int main(int argc, char** argv) { return braid::testing::mpi_test_main(argc, argv); }
