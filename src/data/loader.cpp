// DataLoader: which samples form each batch (shuffle and the sharding rule), making a batch
// (gather, then transforms), and the prefetch thread that makes batches ahead of the consumer.
#include "braid/data/loader.h"

#include <algorithm>
#include <limits>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "braid/parallel.h"

namespace braid::data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Note [Transform randomness]
// Every random draw of the loader comes from a Philox stream keyed by (seed, epoch, stream):
// stream 0 is the epoch's shuffle, stream t + 1 is transform t. Philox is counter-based, so
// transform t reads sample p's uniforms (p = the sample's position in the epoch's order) at blocks
// [p k, p k + k), k = draws_per_sample(), by placing the generator at offset p0 k for a batch whose
// first position is p0 (a shard's batch is a contiguous run of positions; Note [Sharding rule]). A
// sample's augmentation therefore depends on (seed, epoch, position) alone: not on batch size,
// shard count, prefetch depth or whether the run was resumed from a checkpoint.
uint64_t stream_key(uint64_t seed, int64_t epoch, uint64_t stream) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^ stream);
}

// A shard's batch: a run of positions in the epoch's order.
struct Span {
  int64_t start, length;
};

// The sharding rule of Note [Sharding rule] (loader.h).
Span span_of(int64_t size, const DataLoaderOptions& o, int64_t index) {
  const int64_t global = o.num_shards * o.batch_size;
  const int64_t full = size / global, rest = size % global;
  if (index < full) return {index * global + o.shard * o.batch_size, o.batch_size};
  const int64_t q = rest / o.num_shards, m = rest % o.num_shards;
  return {full * global + o.shard * q + std::min(o.shard, m), q + (o.shard < m ? 1 : 0)};
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options)
    : dataset_(std::move(dataset)), opts_(options) {
  BRAID_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  BRAID_CHECK(opts_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", opts_.batch_size);
  BRAID_CHECK(opts_.prefetch >= 0, "DataLoader: prefetch must be non-negative, got ", opts_.prefetch);
  BRAID_CHECK(opts_.num_shards >= 1, "DataLoader: num_shards must be at least 1, got ", opts_.num_shards);
  BRAID_CHECK_T(IndexError, opts_.shard >= 0 && opts_.shard < opts_.num_shards, "DataLoader: shard ",
                opts_.shard, " out of range for num_shards ", opts_.num_shards);
  BRAID_CHECK(opts_.batch_size <= std::numeric_limits<int64_t>::max() / opts_.num_shards,
              "DataLoader: batch_size ", opts_.batch_size, " times num_shards ", opts_.num_shards, " overflows");
  for (size_t i = 0; i < opts_.transforms.size(); ++i)
    BRAID_CHECK(opts_.transforms[i] != nullptr, "DataLoader: transform ", i, " is null");
}

DataLoader::~DataLoader() { stop_worker(); }

int64_t DataLoader::num_batches() const {
  const int64_t size = dataset_->size(), global = opts_.num_shards * opts_.batch_size;
  return size / global + (!opts_.drop_last && size % global != 0 ? 1 : 0);
}

int64_t DataLoader::num_samples() const {
  const int64_t n = num_batches();
  if (n == 0) return 0;
  return (n - 1) * opts_.batch_size + span_of(dataset_->size(), opts_, n - 1).length;
}

std::vector<int64_t> DataLoader::batch_indices(int64_t epoch, int64_t index) const {
  Plan plan;
  Batch b = make_batch(plan, epoch, index, /*load=*/false);
  return b.indices;
}

Batch DataLoader::make_batch(Plan& plan, int64_t epoch, int64_t index, bool load) const {
  BRAID_CHECK_T(IndexError, epoch >= 0 && index >= 0 && index < num_batches(), "DataLoader: batch ", index,
                " of epoch ", epoch, " does not exist (", num_batches(), " batches per epoch)");
  const int64_t size = dataset_->size();
  if (opts_.shuffle && plan.epoch != epoch) {
    Generator gen(stream_key(opts_.seed, epoch, 0));
    plan.order = randperm(size, &gen).to_vector<int64_t>();
    plan.epoch = epoch;
  }
  const Span span = span_of(size, opts_, index);
  Batch b;
  b.epoch = epoch;
  b.index = index;
  b.indices.resize(static_cast<size_t>(span.length));
  for (int64_t i = 0; i < span.length; ++i)
    b.indices[i] = opts_.shuffle ? plan.order[span.start + i] : span.start + i;
  if (!load) return b;

  NoGradGuard no_grad;
  Example ex = dataset_->get_batch(b.indices);
  BRAID_CHECK(ex.input.defined() && ex.input.dim() >= 1 && ex.input.size(0) == span.length, "DataLoader: ",
              "the dataset's get_batch returned input ", ex.input.defined() ? shape_str(ex.input.shape()) : "undefined",
              " for ", span.length, " indices");
  b.input = ex.input;
  b.target = ex.target;
  for (size_t t = 0; span.length > 0 && t < opts_.transforms.size(); ++t) {
    const uint64_t key = stream_key(opts_.seed, epoch, t + 1);
    Generator gen(key);
    gen.set_state(key, static_cast<uint64_t>(span.start) * static_cast<uint64_t>(opts_.transforms[t]->draws_per_sample()));
    b.input = opts_.transforms[t]->apply(b.input, gen);
  }
  // Note [Batches on a device]
  // A batch is made on the host (datasets read files and host memory; transforms index pixels) and
  // moved to options.device (when set) last, in the thread that makes it: with prefetch > 0 the copy runs
  // while the consumer trains on the previous batch, as PyTorch's pin_memory thread plus
  // non_blocking copies do. The backend's copy_from_host is the only transfer path (Note
  // [Transfers] in src/core/tensor.cpp), so the loader has no device-specific code.
  if (opts_.device && b.input.device() != *opts_.device) b.input = b.input.to(*opts_.device);
  if (opts_.device && b.target.defined() && b.target.device() != *opts_.device) b.target = b.target.to(*opts_.device);
  return b;
}

bool DataLoader::next(Batch& out) {
  Item item;
  if (opts_.prefetch == 0) {
    if (batch_ == num_batches()) item.end_of_epoch = true;
    else item.batch = make_batch(plan_, epoch_, batch_, true);
  } else {
    if (!worker_.joinable()) start_worker();
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty(); });
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    cv_.notify_all();
    if (item.error) {
      worker_.join();  // the worker stops after queueing an error; next() restarts it here
      std::rethrow_exception(item.error);
    }
  }
  if (item.end_of_epoch) {
    ++epoch_;
    batch_ = 0;
    return false;
  }
  out = std::move(item.batch);
  ++batch_;
  return true;
}

void DataLoader::seek(int64_t epoch, int64_t batch) {
  BRAID_CHECK_T(IndexError, epoch >= 0 && batch >= 0 && batch <= num_batches(), "DataLoader::seek: position (epoch ",
                epoch, ", batch ", batch, ") is invalid; expected epoch >= 0 and 0 <= batch <= ", num_batches());
  if (epoch == epoch_ && batch == batch_) return;  // keeps what the worker has prefetched
  stop_worker();
  epoch_ = epoch;
  batch_ = batch;
}

void DataLoader::start_worker() {
  stop_ = false;
  worker_ = std::thread(&DataLoader::worker_loop, this, epoch_, batch_);
}

void DataLoader::stop_worker() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  queue_.clear();
}

// Note [One thread for the loader's worker]
// The prefetch thread's ops (the gather of a batch's samples, the transforms) would start OpenMP
// teams of their own beside the training thread's. libgomp then counts more threads than cores and
// makes every waiting thread sleep almost at once instead of spinning, so each barrier of the
// training step's kernels became a futex sleep and wake: the main job's epoch in one process with
// 2 threads on 2 cores took 11.8 s against 8.6 s for 2 ranks of 1 thread (a fifth of its samples in
// the scheduler). The worker makes its batches on one thread, as PyTorch's loader workers do.
void DataLoader::worker_loop(int64_t epoch, int64_t index) {
  ThreadLimitGuard one_thread(1);
  Plan plan;
  const int64_t n = num_batches();
  for (;;) {
    Item item;
    if (index == n) {
      item.end_of_epoch = true;
    } else {
      try {
        item.batch = make_batch(plan, epoch, index, true);
      } catch (...) {
        item.error = std::current_exception();
      }
    }
    const bool failed = item.error != nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < opts_.prefetch; });
      if (stop_) return;
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (failed) return;
    if (index == n) {
      ++epoch;
      index = 0;
    } else {
      ++index;
    }
  }
}

}  // namespace braid::data
