// Data-parallel communication benchmark, run under `mpiexec -n P`: braid's all-reduce against one
// raw MPI_Allreduce and a hand-written Sendrecv ring of the same bytes, a ResNet-18 gradient set in
// DDP-style buckets, the link constants of the ring cost model, and DistributedDataParallel
// training steps (exposed vs. stand-alone communication). Rank 0 prints one JSON object per line;
// benchmarks/dist_bench.py runs the modes and turns them into tables.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/distributed.h"
#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "models.h"

namespace {

namespace dist = braid::distributed;

int g_rank = 0, g_size = 1;
bool g_mpi = false;  // launched by mpiexec: MPI calls are allowed (a plain run never touches MPI)

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void barrier() {
  if (g_mpi) MPI_Barrier(MPI_COMM_WORLD);
}

/// The slowest rank's value of each entry: a collective is as slow as its last member.
std::vector<double> max_over_ranks(std::vector<double> t) {
  if (g_mpi) MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

double mean(const std::vector<double>& t) {
  double s = 0;
  for (double x : t) s += x;
  return t.empty() ? 0 : s / static_cast<double>(t.size());
}

/// Median and 90th percentile of the repetitions: the median for the tables, the p90 because a
/// hand-off between threads shows up as a tail rather than as a shift of the median.
struct Timing {
  double median = 0, p90 = 0;
};

Timing summarise(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return {n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]), t[std::min(n - 1, n * 9 / 10)]};
}

/// One way of doing the same reduction: prepare() (untimed) resets the data, run() is timed,
/// check() (untimed) confirms the result so that a wrong answer cannot pass as a fast one.
struct Method {
  std::function<void()> prepare, run, check;
};

/// Times the methods round-robin within each repetition, so that a burst of background load
/// falls on all of them alike. Every repetition starts from a barrier.
std::vector<Timing> time_methods(int reps, int warmup, const std::vector<Method>& methods) {
  std::vector<std::vector<double>> t(methods.size());
  for (int i = 0; i < warmup + reps; ++i) {
    for (size_t m = 0; m < methods.size(); ++m) {
      if (methods[m].prepare) methods[m].prepare();
      barrier();
      const double t0 = now();
      methods[m].run();
      const double t1 = now();
      if (i >= warmup) t[m].push_back(t1 - t0);
      if (methods[m].check) methods[m].check();
    }
  }
  std::vector<Timing> out;
  for (auto& v : t) out.push_back(summarise(max_over_ranks(v)));
  return out;
}

Timing time_one(int reps, int warmup, std::function<void()> run) {
  return time_methods(reps, warmup, {{{}, run, {}}})[0];
}

/// Enough repetitions for a stable median: many for microsecond messages, a few for 128 MiB.
int reps_for(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((int64_t{1} << 28) / bytes, 11, 201)); }

/// One JSON object on one line, printed by rank 0.
class Record {
 public:
  explicit Record(const std::string& kind) { add("kind", kind); }
  Record& add(const std::string& key, const std::string& v) { return raw(key, "\"" + v + "\""); }
  Record& add(const std::string& key, int64_t v) { return raw(key, std::to_string(v)); }
  Record& add(const std::string& key, double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", v);
    return raw(key, b);
  }
  Record& add(const std::string& key, const Timing& t) { return add(key, t.median).add(key + "_p90", t.p90); }
  Record& add(const std::string& key, const std::vector<int64_t>& v) {
    std::string s;
    for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return raw(key, "[" + s + "]");
  }
  void print() const {
    if (g_rank == 0) std::printf("{%s}\n", body_.c_str());
    std::fflush(stdout);
  }

 private:
  Record& raw(const std::string& key, const std::string& v) {
    body_ += (body_.empty() ? "\"" : ", \"") + key + "\": " + v;
    return *this;
  }
  std::string body_;
};

/// Every element must be `expect` after the reduction; a wrong sum voids the timing.
void check_sum(const char* what, const float* x, int64_t n, float expect) {
  if (x[0] == expect && x[n / 2] == expect && x[n - 1] == expect) return;
  dist::abort_job(std::string(what) + " of " + std::to_string(n) + " floats gave " + std::to_string(x[0]) +
                  ", expected " + std::to_string(expect));
}

/// The bandwidth-optimal ring with nothing clever: p segments, each step one blocking
/// MPI_Sendrecv of a whole segment to the right neighbour, then a plain loop adds what came from
/// the left; then p - 1 steps pass the reduced segments around: the "ideal" that braid's ring aims at.
void ideal_ring(float* x, int64_t n, float* tmp) {
  const int p = g_size, r = g_rank, right = (r + 1) % p, left = (r + p - 1) % p;
  auto begin = [&](int i) { return n * ((i + p) % p) / p; };  // segment i (mod p)
  auto len = [&](int i) { return static_cast<int>(n * ((i + p) % p + 1) / p - begin(i)); };
  for (int s = 0; s < p - 1; ++s) {
    const int out = r - s, in = r - s - 1;
    MPI_Sendrecv(x + begin(out), len(out), MPI_FLOAT, right, 1, tmp, len(in), MPI_FLOAT, left, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    float* dst = x + begin(in);
    for (int64_t i = 0, m = len(in); i < m; ++i) dst[i] += tmp[i];
  }
  // Rank r now holds the full sum of segment r + 1; pass the sums around.
  for (int s = 0; s < p - 1; ++s) {
    const int out = r + 1 - s, in = r - s;
    MPI_Sendrecv(x + begin(out), len(out), MPI_FLOAT, right, 2, x + begin(in), len(in), MPI_FLOAT, left, 2,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}

// Part 4's link constants. A ring step is a simultaneous exchange with the neighbours, so alpha and
// beta come from MPI_Sendrecv in the ring pattern; gamma from the adding loop the ideal ring uses,
// run on every rank at once because the ranks share the memory bus while they add.
void link_constants() {
  const int right = (g_rank + 1) % g_size, left = (g_rank + g_size - 1) % g_size;
  std::vector<float> a(64 << 18, 1.0f), b(64 << 18, 1.0f);  // 64 MiB each
  for (int64_t bytes : {int64_t{4}, int64_t{64}, int64_t{1} << 10, int64_t{1} << 16, int64_t{1} << 18, int64_t{1} << 20,
                        int64_t{4} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    const int count = static_cast<int>(bytes / 4);
    const Timing t = time_one(bytes < (1 << 20) ? 2001 : 21, 5, [&] {
      MPI_Sendrecv(a.data(), count, MPI_FLOAT, right, 3, b.data(), count, MPI_FLOAT, left, 3, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
    });
    Record("sendrecv").add("bytes", bytes).add("seconds", t).print();
  }
  for (int64_t bytes : {int64_t{1} << 20, int64_t{64} << 20}) {
    const int64_t n = bytes / 4;
    const Timing t = time_one(bytes < (4 << 20) ? 201 : 21, 2, [&] {
      float* dst = a.data();
      const float* src = b.data();
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    });
    Record("add").add("bytes", bytes).add("seconds", t).print();
  }
}

// braid's fixed cost per collective: a barrier moves no data, so braid's barrier minus
// MPI_Barrier is the hand-off to the group's worker thread and back.
void fixed_overhead() {
  auto group = dist::world();
  const auto t =
      time_methods(2001, 20, {{{}, [&] { group->barrier(); }, {}}, {{}, [] { MPI_Barrier(MPI_COMM_WORLD); }, {}}});
  Record("barrier").add("braid", t[0]).add("mpi", t[1]).print();
}

// Part 1: one buffer, four ways: braid, braid with deterministic = true (which never takes
// MPI_Iallreduce; Note [All-reduce algorithm] in distributed/mpi_reduce.h), one MPI_Allreduce and
// the ideal ring.
void sweep_all_reduce(int64_t max_bytes) {
  auto group = dist::world();
  const float p = static_cast<float>(g_size);
  dist::AllReduceOptions ring;
  ring.deterministic = true;
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 2) {
    const int64_t n = bytes / 4;
    braid::Tensor t = braid::empty({n});
    float* x = t.data<float>();
    std::vector<float> tmp(static_cast<size_t>(n / g_size + 1), 0.0f);
    auto ones = [&] { std::fill(x, x + n, 1.0f); };
    auto sum_is_p = [&](const char* what) { return [&, what] { check_sum(what, x, n, p); }; };
    const int reps = reps_for(bytes);
    const auto r = time_methods(
        reps, 2,
        {{ones, [&] { group->all_reduce(t); }, sum_is_p("braid all_reduce")},
         {ones, [&] { group->all_reduce(t, dist::ReduceOp::Sum, ring); }, sum_is_p("braid ring all_reduce")},
         {ones, [&] { MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
          sum_is_p("MPI_Allreduce")},
         {ones, [&] { ideal_ring(x, n, tmp.data()); }, sum_is_p("ideal ring")}});
    Record("allreduce")
        .add("bytes", bytes)
        .add("reps", int64_t{reps})
        .add("braid", r[0])
        .add("braid_ring", r[1])
        .add("mpi", r[2])
        .add("ideal", r[3])
        .print();
  }
}

// torchvision's resnet18 parameters in registration order (11,689,512 float32).
std::vector<int64_t> resnet18_numels() {
  std::vector<int64_t> v;
  auto conv = [&](int64_t out, int64_t in, int64_t k) { v.push_back(out * in * k * k); };
  auto bn = [&](int64_t c) { v.push_back(c), v.push_back(c); };  // weight, bias
  conv(64, 3, 7), bn(64);                                        // conv1, bn1
  int64_t in = 64;
  for (int64_t width : {64, 128, 256, 512}) {  // layer1..layer4, two BasicBlocks each
    for (int block = 0; block < 2; ++block) {
      conv(width, in, 3), bn(width), conv(width, width, 3), bn(width);  // conv1 bn1 conv2 bn2
      if (block == 0 && in != width) conv(width, in, 1), bn(width);     // downsample.0, .1
      in = width;
    }
  }
  v.push_back(1000 * 512), v.push_back(1000);  // fc.weight, fc.bias
  return v;
}

/// A zoo model's parameter sizes in registration order.
std::vector<int64_t> zoo_numels(const std::string& name) {
  std::vector<int64_t> v;
  for (const auto& t : braid::zoo::make_model(name, 1, 10)->parameters()) v.push_back(t.numel());
  return v;
}

/// Buckets as DistributedDataParallel forms them: parameters in reverse order, a new bucket when
/// the next one would pass the cap.
std::vector<int64_t> bucket_numels(const std::vector<int64_t>& numels, double cap_mb) {
  const double cap = cap_mb * 1024 * 1024;
  std::vector<int64_t> buckets;
  for (size_t k = numels.size(); k-- > 0;) {
    if (buckets.empty() || static_cast<double>((buckets.back() + numels[k]) * 4) > cap) buckets.push_back(0);
    buckets.back() += numels[k];
  }
  return buckets;
}

/// Every bucket's all_reduce_async(Average) launched back to back, then all waited: DDP's
/// communication with nothing to overlap it with. The gradient copies into and out of the
/// buckets are not included.
Method bucketed_all_reduce(const std::vector<int64_t>& buckets, std::vector<braid::Tensor>& flat) {
  for (int64_t n : buckets) flat.push_back(braid::full({n}, 1.0));
  return {{},
          [&flat] {
            std::vector<dist::WorkPtr> work;
            for (auto& t : flat) work.push_back(dist::world()->all_reduce_async(t, dist::ReduceOp::Average));
            for (auto& w : work) w->wait();
          },
          [&flat] {  // the average of ones is one
            for (auto& t : flat) check_sum("bucketed all_reduce", t.data<float>(), t.numel(), 1.0f);
          }};
}

// Part 2 (and the zoo models' gradients for part 4): a gradient set reduced as
// DistributedDataParallel does, against one raw MPI_Allreduce and the ideal ring of the same bytes.
void gradient_set(const std::string& name, const std::vector<int64_t>& numels, double cap_mb, int reps) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  const auto buckets = bucket_numels(numels, cap_mb);
  std::vector<int64_t> bucket_bytes;
  for (int64_t n : buckets) bucket_bytes.push_back(n * 4);
  std::vector<braid::Tensor> flat;
  std::vector<float> x(static_cast<size_t>(total)), tmp(static_cast<size_t>(total / g_size + 1));
  auto ones = [&] { std::fill(x.begin(), x.end(), 1.0f); };
  auto sum_is_p = [&](const char* what) {
    return [&, what] { check_sum(what, x.data(), total, static_cast<float>(g_size)); };
  };
  const auto r = time_methods(
      reps, 2,
      {bucketed_all_reduce(buckets, flat),
       {ones,
        [&] { MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        sum_is_p("MPI_Allreduce")},
       {ones, [&] { ideal_ring(x.data(), total, tmp.data()); }, sum_is_p("ideal ring")}});
  Record("gradients")
      .add("model", name)
      .add("ranks", int64_t{g_size})
      .add("params", total)
      .add("tensors", static_cast<int64_t>(numels.size()))
      .add("bucket_bytes", bucket_bytes)
      .add("braid", r[0])
      .add("mpi", r[1])
      .add("ideal", r[2])
      .print();
}

// Part 3: training steps of a zoo model, data-parallel when there is more than one rank, plain
// (no DistributedDataParallel, no MPI) on one. The per-rank batch stays the same (weak scaling).
void train(const std::string& name, int64_t batch, int steps, int warmup, double bucket_mb) {
  braid::manual_seed(1 + static_cast<uint64_t>(g_rank));
  auto model = braid::zoo::make_model(name, 1, 10);
  braid::optim::SGDOptions so;
  so.lr = 0.01;
  braid::optim::SGD opt(model->parameters(), so);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  dist::DataParallelOptions o;
  o.bucket_cap_mb = bucket_mb;
  if (g_size > 1) ddp = std::make_unique<dist::DistributedDataParallel>(model, dist::world(), o);
  braid::Tensor x = braid::randn({batch, 1, 28, 28});  // Fashion-MNIST-shaped
  braid::Tensor y = braid::randint(0, 10, {batch});
  std::vector<double> step, fwd, bwd, upd, exposed, compute_end;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) barrier();
    const double t0 = now();
    braid::Tensor loss = braid::nn::cross_entropy((*model)(x), y);
    const double t1 = now();
    opt.zero_grad();
    loss.backward();  // with DDP this includes the wait for the all-reduces still in flight
    const double t2 = now();
    opt.step();
    const double t3 = now();
    if (i < warmup) continue;
    const double e = ddp ? ddp->last_stats().exposed_seconds : 0.0;
    step.push_back(t3 - t0), fwd.push_back(t1 - t0), bwd.push_back(t2 - t1), upd.push_back(t3 - t2);
    exposed.push_back(e), compute_end.push_back(t2 - e);
  }
  // The step of a synchronous job is its slowest rank's: per-rank means, then the largest.
  const auto m = max_over_ranks({mean(step), mean(fwd), mean(bwd), mean(upd)});
  // A rank's exposed wait also holds the time it waited for a slower peer to finish backward. The
  // rank whose backward ended last in a step waited for communication alone, so its wait is the
  // step's exposed communication; the ranks share one node's steady clock, so the ends compare.
  double exposed_mean = 0, exposed_last = 0, skew = 0;
  if (ddp) {
    exposed_mean = mean(exposed) / g_size;
    MPI_Allreduce(MPI_IN_PLACE, &exposed_mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    std::vector<double> all_end(compute_end.size() * static_cast<size_t>(g_size)), all_exposed(all_end.size());
    MPI_Allgather(compute_end.data(), steps, MPI_DOUBLE, all_end.data(), steps, MPI_DOUBLE, MPI_COMM_WORLD);
    MPI_Allgather(exposed.data(), steps, MPI_DOUBLE, all_exposed.data(), steps, MPI_DOUBLE, MPI_COMM_WORLD);
    for (int s = 0; s < steps; ++s) {
      int last = 0;
      double first_end = all_end[static_cast<size_t>(s)];
      for (int r = 0; r < g_size; ++r) {
        const double end = all_end[static_cast<size_t>(r * steps + s)];
        if (end > all_end[static_cast<size_t>(last * steps + s)]) last = r;
        first_end = std::min(first_end, end);
      }
      exposed_last += all_exposed[static_cast<size_t>(last * steps + s)] / steps;
      skew += (all_end[static_cast<size_t>(last * steps + s)] - first_end) / steps;
    }
  }
  Timing comm;
  int64_t bytes = 0;
  std::vector<int64_t> buckets;
  if (ddp) {  // the same buckets again, with no backward to hide behind
    std::map<std::string, int64_t> numel;
    for (const auto& [pname, t] : model->named_parameters()) numel[pname] = t.numel();
    for (const auto& names : ddp->bucket_names()) {
      int64_t n = 0;
      for (const auto& pname : names) n += numel.at(pname);
      buckets.push_back(n);
    }
    std::vector<braid::Tensor> flat;
    comm = time_methods(51, 2, {bucketed_all_reduce(buckets, flat)})[0];
  }
  for (const auto& t : model->parameters()) bytes += t.numel() * 4;
  Record("train")
      .add("model", name)
      .add("ranks", int64_t{g_size})
      .add("threads", int64_t{braid::get_num_threads()})
      .add("batch", batch)
      .add("steps", int64_t{steps})
      .add("bucket_mb", bucket_mb)
      .add("buckets", static_cast<int64_t>(buckets.size()))
      .add("grad_bytes", bytes)
      .add("step", m[0])
      .add("forward", m[1])
      .add("backward", m[2])
      .add("update", m[3])
      .add("exposed_mean", exposed_mean)
      .add("exposed_last", exposed_last)
      .add("skew", skew)
      .add("comm_alone", comm)
      .print();
}

int usage() {
  std::fprintf(stderr,
               "usage: braid-allreduce-bench sweep [MAX_MIB]        (under mpiexec -n P, P >= 2)\n"
               "       braid-allreduce-bench comm MODEL [BUCKET_MB]  (under mpiexec -n P, P >= 2)\n"
               "       braid-allreduce-bench train MODEL [BATCH STEPS WARMUP BUCKET_MB]\n"
               "MODEL is one of mlp, cnn, resnet; train runs plainly (one rank) or under mpiexec.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || (args[0] != "sweep" && args.size() < 2)) return usage();
  const auto& info = dist::init();
  g_rank = info.rank, g_size = info.size, g_mpi = info.launcher != "none";
  auto arg = [&](size_t i, double fallback) { return args.size() > i ? std::atof(args[i].c_str()) : fallback; };
  if (args[0] == "train") {
    train(args[1], static_cast<int64_t>(arg(2, 32)), static_cast<int>(arg(3, 20)), static_cast<int>(arg(4, 5)),
          arg(5, 25));
  } else if (!g_mpi || g_size < 2) {
    std::fprintf(stderr, "%s needs at least two ranks: mpiexec -n 2 %s %s\n", args[0].c_str(), argv[0],
                 args[0].c_str());
    return 2;
  } else if (args[0] == "sweep") {
    link_constants();
    fixed_overhead();
    sweep_all_reduce(static_cast<int64_t>(arg(1, 128)) << 20);
    gradient_set("resnet18", resnet18_numels(), 25, 11);
  } else if (args[0] == "comm") {
    gradient_set(args[1], zoo_numels(args[1]), arg(2, 25), 51);
  } else {
    return usage();
  }
  dist::finalize();
  return 0;
}
