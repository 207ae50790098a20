// Tests of braid/data.h: the sharding and shuffling rules checked against their closed forms,
// prefetch against synchronous loading, resume by seek, errors from the background thread, the
// transforms against direct loops, and every reader against files built by hand (IDX, gzip with
// stored blocks and its own CRC32, CIFAR-10, CSV), against bytes NumPy wrote
// (tests/data/data_reference.txt, made by make_data_reference.py), and against the real
// Fashion-MNIST when Debian's dataset-fashion-mnist is installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "braid/braid.h"
#include "error_of.h"
#include "braid/data.h"
#include "test_paths.h"

namespace braid {
namespace {

using data::Batch;
using data::DataLoader;
using data::DataLoaderOptions;

// ---- helpers ----

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "braid-data-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// A dataset whose example i is input [i, -i] (float32) and target i (int64).
Tensor ramp_inputs(int64_t n) {
  std::vector<float> v(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    v[2 * i] = static_cast<float>(i);
    v[2 * i + 1] = static_cast<float>(-i);
  }
  return tensor(v, {n, 2});
}
std::shared_ptr<data::TensorDataset> ramp(int64_t n) {
  return std::make_shared<data::TensorDataset>(ramp_inputs(n), arange(n));
}

std::vector<int64_t> all_indices(DataLoader& loader) {
  std::vector<int64_t> out;
  Batch b;
  while (loader.next(b)) out.insert(out.end(), b.indices.begin(), b.indices.end());
  return out;
}

// ---- datasets ----

TEST(Dataset, TensorDatasetGathersRowsInOrder) {
  data::TensorDataset ds(ramp_inputs(6), arange(6));
  data::Example b = ds.get_batch({4, 0, 4});
  EXPECT_EQ(b.input.to_vector<float>(), (std::vector<float>{4, -4, 0, 0, 4, -4}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{4, 0, 4}));
  EXPECT_EQ(ds.get(5).input.to_vector<float>(), (std::vector<float>{5, -5}));
  EXPECT_CONTAINS(error_of<IndexError>([&] { ds.get_batch({6}); }), "index_select");
  EXPECT_CONTAINS(error_of<IndexError>([&] { ds.get(-1); }), "index -1 out of range for 6");
  EXPECT_CONTAINS(error_of<ValueError>([] { data::TensorDataset(zeros({3, 2}), zeros({4})); }), "[3, 2] and targets [4]");
}

// get() computes its example, so get_batch uses the default (stacking) path.
class SquaresDataset : public data::Dataset {
 public:
  int64_t size() const override { return 7; }
  data::Example get(int64_t i) const override {
    const double v = static_cast<double>(i * i);
    return {full({2, 2}, v), scalar_tensor(static_cast<double>(i), kInt64)};
  }
};

TEST(Dataset, DefaultGetBatchStacksExamples) {
  SquaresDataset ds;
  data::Example b = ds.get_batch({3, 1});
  EXPECT_EQ(b.input.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(b.input.to_vector<float>(), (std::vector<float>{9, 9, 9, 9, 1, 1, 1, 1}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{3, 1}));
  data::Example empty = ds.get_batch({});
  EXPECT_EQ(empty.input.shape(), (Shape{0, 2, 2}));
  EXPECT_EQ(empty.target.shape(), (Shape{0}));
}

// ---- batching, shuffling, sharding ----

TEST(DataLoader, SequentialBatchesAndDropLast) {
  for (int64_t prefetch : {0, 2}) {
    DataLoader loader(ramp(10), {.batch_size = 4, .prefetch = prefetch});
    EXPECT_EQ(loader.num_batches(), 3);
    EXPECT_EQ(loader.num_samples(), 10);
    std::vector<std::vector<int64_t>> got;
    for (Batch& b : loader) {
      got.push_back(b.target.to_vector<int64_t>());
      EXPECT_EQ(b.indices, got.back());
      EXPECT_EQ(b.input.shape(), (Shape{b.target.numel(), 2}));
    }
    EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
    EXPECT_EQ(loader.epoch(), 1);  // the end of the epoch moved the position on
    EXPECT_EQ(loader.batch(), 0);

    DataLoader dropping(ramp(10), {.batch_size = 4, .drop_last = true, .prefetch = prefetch});
    EXPECT_EQ(dropping.num_batches(), 2);
    EXPECT_EQ(dropping.num_samples(), 8);
    EXPECT_EQ(all_indices(dropping), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  }
}

TEST(DataLoader, ShuffleIsASeededPermutationPerEpoch) {
  const int64_t n = 50;
  DataLoader a(ramp(n), {.batch_size = 8, .shuffle = true, .seed = 7});
  DataLoader b(ramp(n), {.batch_size = 8, .shuffle = true, .seed = 7, .prefetch = 0});
  DataLoader c(ramp(n), {.batch_size = 8, .shuffle = true, .seed = 8});
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> ia = all_indices(a), ib = all_indices(b), ic = all_indices(c);
    std::vector<int64_t> sorted = ia;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> expect(n);
    for (int64_t i = 0; i < n; ++i) expect[i] = i;
    EXPECT_EQ(sorted, expect) << "epoch " << e << " is not a permutation";
    EXPECT_EQ(ia, ib) << "the same seed gave another order (prefetch vs synchronous)";
    EXPECT_NE(ia, ic) << "another seed gave the same order";
    EXPECT_NE(ia, expect) << "not shuffled";
    for (const auto& prev : epochs) EXPECT_NE(ia, prev) << "epoch " << e << " repeats an earlier order";
    epochs.push_back(ia);
  }
  // The order depends on (seed, epoch) only: jumping to epoch 2 gives the same order.
  DataLoader d(ramp(n), {.batch_size = 8, .shuffle = true, .seed = 7});
  d.set_epoch(2);
  EXPECT_EQ(all_indices(d), epochs[2]);
}

struct ShardCase {
  int64_t size, shards, batch;
  bool drop_last;
};

void PrintTo(const ShardCase& c, std::ostream* os) {
  *os << "S" << c.size << "_N" << c.shards << "_b" << c.batch << (c.drop_last ? "_drop" : "");
}

class Sharding : public ::testing::TestWithParam<ShardCase> {};

// Note [Sharding rule] in loader.h, checked against its closed form.
TEST_P(Sharding, EverySampleOncePerEpochAndEqualBatchCounts) {
  const auto [size, n, b, drop] = GetParam();
  const int64_t g = n * b, full = size / g, rest = size % g;
  const int64_t batches = full + (!drop && rest > 0 ? 1 : 0);
  DataLoader whole(ramp(size), {.batch_size = g, .shuffle = true, .drop_last = drop, .seed = 3});
  ASSERT_EQ(whole.num_batches(), batches);
  for (int64_t epoch : {0, 1}) {
    std::map<int64_t, int> seen;
    std::vector<std::vector<int64_t>> joined(static_cast<size_t>(batches));
    for (int64_t r = 0; r < n; ++r) {
      DataLoader shard(ramp(size), {.batch_size = b, .shuffle = true, .drop_last = drop, .seed = 3, .num_shards = n, .shard = r});
      ASSERT_EQ(shard.num_batches(), batches) << "shard " << r;
      int64_t samples = 0;
      for (int64_t j = 0; j < batches; ++j) {
        std::vector<int64_t> idx = shard.batch_indices(epoch, j);
        const int64_t expect = j < full ? b : rest / n + (r < rest % n ? 1 : 0);
        EXPECT_EQ(static_cast<int64_t>(idx.size()), expect) << "shard " << r << " batch " << j;
        samples += static_cast<int64_t>(idx.size());
        for (int64_t i : idx) ++seen[i];
        joined[j].insert(joined[j].end(), idx.begin(), idx.end());
      }
      EXPECT_EQ(shard.num_samples(), samples);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), drop ? full * g : size);
    for (const auto& [i, count] : seen) EXPECT_EQ(count, 1) << "sample " << i << " in epoch " << epoch;
    // N shards of batch b see, step by step, what one loader of batch N b sees.
    for (int64_t j = 0; j < batches; ++j) EXPECT_EQ(joined[j], whole.batch_indices(epoch, j)) << "global batch " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Sharding,
                         ::testing::Values(ShardCase{10, 1, 4, false}, ShardCase{10, 1, 4, true}, ShardCase{23, 3, 2, false},
                                           ShardCase{23, 3, 2, true}, ShardCase{9, 4, 2, false}, ShardCase{9, 4, 2, true},
                                           ShardCase{16, 4, 2, false}, ShardCase{17, 2, 8, false}, ShardCase{5, 4, 3, false},
                                           ShardCase{5, 4, 3, true}, ShardCase{100, 4, 7, false}));

TEST(DataLoader, EmptyLastBatchWhenRemainderIsSmallerThanShards) {
  // S = 9, N = 4, b = 2: one global batch of 8, then 1 sample left for 4 shards.
  for (int64_t r = 0; r < 4; ++r) {
    DataLoader loader(ramp(9), {.batch_size = 2, .num_shards = 4, .shard = r});
    Batch b;
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.indices, (std::vector<int64_t>{2 * r, 2 * r + 1}));
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.input.shape(), (Shape{r == 0 ? 1 : 0, 2}));
    EXPECT_EQ(b.target.shape(), (Shape{r == 0 ? 1 : 0}));
    if (r == 0) {
      EXPECT_EQ(b.indices, (std::vector<int64_t>{8}));
    }
    EXPECT_FALSE(loader.next(b));
  }
}

TEST(DataLoader, OptionsAreValidated) {
  EXPECT_CONTAINS(error_of<ValueError>([] { DataLoader(ramp(4), {.batch_size = 0}); }), "batch_size must be at least 1");
  EXPECT_CONTAINS(error_of<IndexError>([] { DataLoader(ramp(4), {.num_shards = 2, .shard = 2}); }),
                  "shard 2 out of range for num_shards 2");
  EXPECT_CONTAINS(error_of<ValueError>([] { DataLoader(ramp(4), {.prefetch = -1}); }), "prefetch");
  DataLoader loader(ramp(10), {.batch_size = 4});
  EXPECT_CONTAINS(error_of<IndexError>([&] { loader.seek(0, 4); }), "0 <= batch <= 3");
  EXPECT_CONTAINS(error_of<IndexError>([&] { loader.batch_indices(0, 3); }), "batch 3 of epoch 0 does not exist");
}

// ---- prefetch, resume, errors ----

std::vector<std::shared_ptr<const data::Transform>> augment() {
  return {std::make_shared<data::RandomCrop>(4, 1), std::make_shared<data::RandomHorizontalFlip>(0.5),
          std::make_shared<data::Normalize>(std::vector<double>{0.5}, std::vector<double>{0.25})};
}

std::shared_ptr<data::TensorDataset> images(int64_t n) {
  Generator g(11);
  return std::make_shared<data::TensorDataset>(rand({n, 1, 4, 4}, kFloat32, &g), arange(n));
}

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_TRUE(equal(a.input, b.input)) << "epoch " << a.epoch << " batch " << a.index;
  EXPECT_TRUE(equal(a.target, b.target));
}

// A transform that records the thread count its caller's ops would use.
class ThreadCountProbe : public data::Transform {
 public:
  explicit ThreadCountProbe(std::atomic<int>* seen) : seen_(seen) {}
  Tensor apply(const Tensor& x, Generator&) const override {
    seen_->store(get_num_threads());
    return x;
  }
  std::string describe() const override { return "ThreadCountProbe()"; }

 private:
  std::atomic<int>* seen_;
};

// Note [One thread for the loader's worker]: the prefetch thread makes its batches on one thread;
// a synchronous loader's batches are made on the caller's thread with the caller's count.
TEST(DataLoader, ThePrefetchWorkerMakesBatchesOnOneThread) {
  const int before = get_num_threads();
  set_num_threads(2);
  std::atomic<int> seen{0};
  DataLoaderOptions o{.batch_size = 4, .prefetch = 2, .transforms = {std::make_shared<ThreadCountProbe>(&seen)}};
  DataLoader ahead(images(8), o);
  Batch b;
  ASSERT_TRUE(ahead.next(b));
  EXPECT_EQ(seen.load(), 1);
  o.prefetch = 0;
  DataLoader sync(images(8), o);
  ASSERT_TRUE(sync.next(b));
  EXPECT_EQ(seen.load(), 2);
  set_num_threads(before);
}

TEST(ThreadLimitGuard, CapsTheCallingThreadOnlyAndRestores) {
  const int before = get_num_threads();
  set_num_threads(3);
  {
    ThreadLimitGuard two(2);
    EXPECT_EQ(get_num_threads(), 2);
    int other = 0;
    std::thread([&other] { other = get_num_threads(); }).join();
    EXPECT_EQ(other, 3);  // another thread keeps the process's count
    {
      ThreadLimitGuard more(8);  // a cap above the process's count leaves the count
      EXPECT_EQ(get_num_threads(), 3);
    }
    EXPECT_EQ(get_num_threads(), 2);
  }
  EXPECT_EQ(get_num_threads(), 3);
  EXPECT_CONTAINS(error_of<ValueError>([] { ThreadLimitGuard none(0); }), "ThreadLimitGuard: expected a positive");
  set_num_threads(before);
}

TEST(DataLoader, PrefetchGivesTheSynchronousBatchesBitwise) {
  DataLoaderOptions o{.batch_size = 6, .shuffle = true, .seed = 5, .prefetch = 0, .transforms = augment()};
  DataLoader sync(images(27), o);
  o.prefetch = 3;
  DataLoader ahead(images(27), o);
  int64_t count = 0;
  for (int e = 0; e < 3; ++e) {
    Batch a, b;
    for (;;) {
      const bool more = sync.next(a);
      ASSERT_EQ(more, ahead.next(b));
      if (!more) break;
      expect_same_batch(a, b);
      ++count;
    }
  }
  EXPECT_EQ(count, 3 * 5);
}

TEST(DataLoader, BatchesOnADeviceAreTheHostBatchesMoved) {
  // The shadow device refuses host access, so equality is checked on copies brought back. The host
  // loader's batches are on the dataset's device (the test's default device).
  for (int64_t prefetch : {0, 2}) {
    DataLoaderOptions o{.batch_size = 4, .shuffle = true, .seed = 3, .prefetch = prefetch, .num_shards = 3,
                        .shard = 2, .transforms = augment()};
    DataLoader host(images(13), o);
    o.device = Device::shadow();
    DataLoader dev(images(13), o);
    int64_t count = 0;
    Batch a, b;
    for (;;) {
      const bool more = host.next(a);
      ASSERT_EQ(more, dev.next(b));
      if (!more) break;
      EXPECT_EQ(b.input.device(), Device::shadow());
      EXPECT_EQ(b.target.device(), Device::shadow());
      EXPECT_EQ(a.indices, b.indices);
      EXPECT_TRUE(equal(a.input.cpu(), b.input.cpu())) << "batch " << a.index;
      EXPECT_TRUE(equal(a.target.cpu(), b.target.cpu()));
      ++count;
    }
    EXPECT_EQ(count, host.num_batches());  // 13 over 3 shards of 4: one full global batch, one short one
    EXPECT_EQ(count, 2);
  }
}

TEST(DataLoader, SeekResumesWithExactlyTheRemainingBatches) {
  DataLoaderOptions o{.batch_size = 4, .shuffle = true, .seed = 9, .transforms = augment()};
  DataLoader first(images(18), o);  // 5 batches per epoch
  Batch b;
  while (first.next(b)) {
  }
  ASSERT_TRUE(first.next(b));
  ASSERT_TRUE(first.next(b));
  ASSERT_EQ(first.epoch(), 1);
  ASSERT_EQ(first.batch(), 2);
  std::vector<Batch> rest;
  while (first.next(b)) rest.push_back(b);
  ASSERT_TRUE(first.next(b));
  rest.push_back(b);  // and the next epoch goes on alike

  for (int64_t prefetch : {0, 2}) {
    o.prefetch = prefetch;
    DataLoader resumed(images(18), o);
    resumed.seek(1, 2);
    std::vector<Batch> got;
    while (resumed.next(b)) got.push_back(b);
    ASSERT_TRUE(resumed.next(b));
    got.push_back(b);
    ASSERT_EQ(got.size(), rest.size());
    for (size_t i = 0; i < got.size(); ++i) expect_same_batch(got[i], rest[i]);
  }

  // The position just past an epoch's last batch ends that epoch, as next() would have.
  DataLoader at_end(images(18), o);
  at_end.seek(3, 5);
  EXPECT_FALSE(at_end.next(b));
  EXPECT_EQ(at_end.epoch(), 4);
  EXPECT_EQ(at_end.batch(), 0);
}

// A checkpoint stores (epoch, global batch); a job that stops there at N ranks and resumes at M
// (braid-train on preemption, Note [Preemption]) must see every sample of that epoch exactly once,
// and from the resume on the same global batches an uninterrupted M-rank run sees.
TEST(DataLoader, ResumingAtAnotherWorldSizeSeesEachSampleOfTheEpochOnce) {
  const int64_t n = 103, global = 12;  // 8 global batches, 7 samples dropped per epoch
  auto indices_of = [&](int64_t shards, int64_t epoch, int64_t from, int64_t to) {
    std::vector<int64_t> seen;
    for (int64_t r = 0; r < shards; ++r) {
      DataLoader l(ramp(n), {.batch_size = global / shards, .shuffle = true, .drop_last = true, .seed = 5,
                             .num_shards = shards, .shard = r});
      for (int64_t j = from; j < to; ++j)
        for (int64_t i : l.batch_indices(epoch, j)) seen.push_back(i);
    }
    return seen;
  };
  const std::vector<int64_t> whole = indices_of(1, 1, 0, 8);  // one process, epoch 1
  for (auto [before, after] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {1, 2}, {2, 4}, {4, 3}, {3, 6}}) {
    for (int64_t stop : {1, 3, 7}) {
      std::vector<int64_t> seen = indices_of(before, 1, 0, stop), rest = indices_of(after, 1, stop, 8);
      seen.insert(seen.end(), rest.begin(), rest.end());
      std::vector<int64_t> a = seen, b = whole;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << before << " -> " << after << " ranks at batch " << stop;
      EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), a.size()) << "a sample seen twice";
      EXPECT_EQ(a.size(), static_cast<size_t>(8 * global));
    }
  }
  // And the loader itself, seeking where a checkpoint says, gives shard r of M exactly those batches.
  DataLoader resumed(ramp(n), {.batch_size = 3, .shuffle = true, .drop_last = true, .seed = 5, .num_shards = 4, .shard = 2});
  resumed.seek(1, 5);
  Batch b;
  for (int64_t j = 5; j < 8; ++j) {
    ASSERT_TRUE(resumed.next(b));
    const std::vector<int64_t> want = resumed.batch_indices(1, j);
    const std::vector<int64_t> got = b.target.to_vector<int64_t>();
    EXPECT_EQ(got, want) << "batch " << j;
  }
  EXPECT_FALSE(resumed.next(b));
}

// Example 13 is "corrupt"; the others are [i, i] -> i.
class FailingDataset : public data::Dataset {
 public:
  int64_t size() const override { return 20; }
  data::Example get(int64_t i) const override {
    BRAID_CHECK_T(IndexError, i != 13, "FailingDataset: example ", i, " is corrupt");
    return {full({2}, static_cast<double>(i)), scalar_tensor(static_cast<double>(i), kInt64)};
  }
};

TEST(DataLoader, AnErrorInThePrefetchThreadReachesTheConsumerUnchanged) {
  for (int64_t prefetch : {0, 1, 4}) {
    DataLoader loader(std::make_shared<FailingDataset>(), {.batch_size = 4, .prefetch = prefetch});
    Batch b;
    for (int64_t j = 0; j < 3; ++j) {
      ASSERT_TRUE(loader.next(b));
      EXPECT_EQ(b.target.to_vector<int64_t>()[0], 4 * j);
    }
    // Batch 3 holds example 13: the original IndexError, then again on retry, at the same position.
    EXPECT_EQ(error_of<IndexError>([&] { loader.next(b); }), "FailingDataset: example 13 is corrupt");
    EXPECT_EQ(loader.batch(), 3);
    EXPECT_EQ(error_of<IndexError>([&] { loader.next(b); }), "FailingDataset: example 13 is corrupt");
    loader.seek(0, 4);  // skipping the bad batch recovers
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{16, 17, 18, 19}));
  }
}

// Each example is a .npy file; a corrupt one must surface as read_npy's error, naming the file.
class NpyFilesDataset : public data::Dataset {
 public:
  explicit NpyFilesDataset(std::string dir) : dir_(std::move(dir)) {}
  int64_t size() const override { return 6; }
  data::Example get(int64_t i) const override {
    return {data::read_npy(dir_ + "/" + std::to_string(i) + ".npy"), scalar_tensor(static_cast<double>(i), kInt64)};
  }

 private:
  std::string dir_;
};

TEST(DataLoader, ACorruptFileReadInThePrefetchThreadNamesTheFile) {
  TempDir dir;
  for (int i = 0; i < 6; ++i) data::write_npy(dir.file(std::to_string(i) + ".npy"), full({3}, i));
  const std::string bad = dir.file("4.npy");
  write_file(bad, read_file(bad).substr(0, 130));  // cut inside the data
  DataLoader loader(std::make_shared<NpyFilesDataset>(dir.path()), {.batch_size = 2, .prefetch = 2});
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.input.to_vector<float>(), (std::vector<float>{2, 2, 2, 3, 3, 3}));
  const std::string msg = error_of([&] { loader.next(b); });
  EXPECT_CONTAINS(msg, bad);
  EXPECT_CONTAINS(msg, "truncated");
}

// Counts get_batch calls; each takes a little while, so the worker is often mid-batch.
class SlowDataset : public data::TensorDataset {
 public:
  SlowDataset() : TensorDataset(ramp_inputs(1000), arange(1000)) {}
  data::Example get_batch(const std::vector<int64_t>& indices) const override {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return TensorDataset::get_batch(indices);
  }
  mutable std::atomic<int> calls{0};
};

TEST(DataLoader, PrefetchIsBoundedAndDestructionMidEpochReturns) {
  auto ds = std::make_shared<SlowDataset>();
  {
    DataLoader loader(ds, {.batch_size = 2, .prefetch = 3});
    Batch b;
    ASSERT_TRUE(loader.next(b));
    // The worker runs ahead by prefetch queued batches plus the one it holds while waiting for room,
    // and no further: wait for it to get there (however loaded the machine), then give it time to overshoot.
    // A correct loader passes whatever the sleep's length (the worker is blocked); the sleep only gives
    // a loader that overshoots the chance to show it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (ds->calls.load() < 1 + 3 + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(ds->calls.load(), 1 + 3 + 1);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.indices, (std::vector<int64_t>{20, 21}));
  }  // destroyed mid-epoch, the worker busy or waiting: must not hang
  const int after = ds->calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // as above: only a worker left running could count
  EXPECT_EQ(ds->calls.load(), after) << "the worker outlived its loader";
  {
    DataLoader loader(ds, {.batch_size = 2, .prefetch = 1});
    loader.seek(3, 5);  // a seek before the first batch starts no thread
  }
  EXPECT_EQ(ds->calls.load(), after);
}

// ---- transforms ----

TEST(Transforms, NormalizeIsPerChannelAffine) {
  Generator g(1);
  Tensor x = rand({2, 3, 2, 2}, kFloat64, &g);
  data::Normalize norm({0.1, 0.2, 0.3}, {0.5, 2.0, 4.0});
  Tensor y = norm.apply(x, g);
  const std::vector<double> xs = x.to_vector<double>(), ys = y.to_vector<double>();
  const double mean[] = {0.1, 0.2, 0.3}, sd[] = {0.5, 2.0, 4.0};
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t c = (i / 4) % 3;
    EXPECT_DOUBLE_EQ(ys[i], (xs[i] - mean[c]) / sd[c]);
  }
  EXPECT_EQ(norm.describe(), "Normalize(mean=[0.1, 0.2, 0.3], std=[0.5, 2, 4])");
  EXPECT_CONTAINS(error_of<ValueError>([&] { data::Normalize({0.1, 0.2}, {1, 1}).apply(x, g); }), "2 values for 3 channels");
  EXPECT_CONTAINS(error_of<ValueError>([] { data::Normalize({0.1}, {0.0}); }), "positive");
}

TEST(Transforms, RandomCropCutsThePaddedImageAtTheDrawnOffsets) {
  const int64_t n = 1000, c = 2, h = 5, w = 6, pad = 2, size = 4;
  Generator g(3);
  Tensor x = rand({n, c, h, w}, kFloat32, &g);
  Generator draw(77), replay(77);
  Tensor y = data::RandomCrop(size, pad).apply(x, draw);
  ASSERT_EQ(y.shape(), (Shape{n, c, size, size}));
  EXPECT_EQ(draw.offset(), static_cast<uint64_t>(2 * n));  // two uniforms per sample
  const std::vector<double> u = rand({n, 2}, kFloat64, &replay).to_vector<double>();
  const std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
  std::set<std::pair<int64_t, int64_t>> offsets;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rows = h + 2 * pad - size + 1, cols = w + 2 * pad - size + 1;
    const int64_t dy = static_cast<int64_t>(u[2 * i] * rows), dx = static_cast<int64_t>(u[2 * i + 1] * cols);
    offsets.insert({dy, dx});
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t r = 0; r < size; ++r)
        for (int64_t q = 0; q < size; ++q) {
          const int64_t sr = r + dy - pad, sq = q + dx - pad;  // source pixel, zero outside
          const float expect = sr >= 0 && sr < h && sq >= 0 && sq < w ? xs[((i * c + ch) * h + sr) * w + sq] : 0.0f;
          ASSERT_EQ(ys[((i * c + ch) * size + r) * size + q], expect) << "sample " << i;
        }
  }
  EXPECT_EQ(offsets.size(), static_cast<size_t>((h + 2 * pad - size + 1) * (w + 2 * pad - size + 1)));
  EXPECT_CONTAINS(error_of<ValueError>([&] { data::RandomCrop(10, 1).apply(x, g); }), "smaller than the crop");
}

TEST(Transforms, HorizontalFlipMirrorsAboutPOfTheSamples) {
  const int64_t n = 2000;
  const double p = 0.3;
  Tensor x = arange(0.0, static_cast<double>(n * 2 * 3), 1.0, kFloat32).reshape({n, 1, 2, 3});
  Generator g(5);
  Tensor y = data::RandomHorizontalFlip(p).apply(x, g);
  const std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
  int64_t flipped = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool same = true, mirrored = true;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t q = 0; q < 3; ++q) {
        same &= ys[i * 6 + r * 3 + q] == xs[i * 6 + r * 3 + q];
        mirrored &= ys[i * 6 + r * 3 + q] == xs[i * 6 + r * 3 + (2 - q)];
      }
    ASSERT_TRUE(same || mirrored) << "sample " << i;
    flipped += mirrored;
  }
  // Binomial(2000, 0.3): mean 600, standard deviation 20.5; 5 standard deviations either way.
  EXPECT_NEAR(static_cast<double>(flipped), n * p, 5 * std::sqrt(n * p * (1 - p)));
}

// Note [Transform randomness]: a sample's augmentation depends on (seed, epoch, position) only.
TEST(Transforms, AugmentationIsTheSameAcrossShardsAndBatchSizes) {
  const int64_t size = 29;
  DataLoaderOptions whole_opts{.batch_size = 6, .shuffle = true, .seed = 21, .transforms = augment()};
  DataLoader whole(images(size), whole_opts);
  std::map<int64_t, std::vector<float>> by_sample;  // epoch 1's augmented input of each sample
  whole.set_epoch(1);
  for (Batch& b : whole)
    for (size_t i = 0; i < b.indices.size(); ++i)
      by_sample[b.indices[i]] = b.input.select(0, static_cast<int64_t>(i)).to_vector<float>();
  ASSERT_EQ(by_sample.size(), static_cast<size_t>(size));
  int64_t checked = 0;
  for (int64_t r = 0; r < 3; ++r) {
    DataLoaderOptions o = whole_opts;
    o.batch_size = 2;
    o.num_shards = 3;
    o.shard = r;
    DataLoader shard(images(size), o);
    shard.set_epoch(1);
    for (Batch& b : shard)
      for (size_t i = 0; i < b.indices.size(); ++i, ++checked)
        EXPECT_EQ(b.input.select(0, static_cast<int64_t>(i)).to_vector<float>(), by_sample[b.indices[i]])
            << "sample " << b.indices[i] << " on shard " << r;
  }
  EXPECT_EQ(checked, size);
}

// ---- IDX / MNIST ----

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string idx_bytes(const Shape& shape, const std::vector<uint8_t>& values, uint8_t type = 0x08) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(shape.size())};
  for (int64_t d : shape) s += be32(static_cast<uint32_t>(d));
  return s + std::string(values.begin(), values.end());
}

// CRC-32 (IEEE 802.3, reflected), bit by bit: independent of zlib.
uint32_t crc32_ref(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

std::string le32(uint32_t v) {
  return {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
}

// A gzip member (RFC 1952) whose deflate stream is stored blocks (RFC 1951, 3.2.4).
std::string gzip_stored(const std::string& data) {
  std::string out = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, '\xff'};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, data.size() - pos);
    const bool last = pos + n == data.size();
    out += {static_cast<char>(last), static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(~n),
            static_cast<char>(~n >> 8)};
    out += data.substr(pos, n);
    pos += n;
  } while (pos < data.size());
  return out + le32(crc32_ref(data)) + le32(static_cast<uint32_t>(data.size()));
}

std::vector<uint8_t> pixel_pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return v;
}

TEST(ReadIdx, PlainAndGzipFiles) {
  TempDir dir;
  const std::vector<uint8_t> px = pixel_pattern(2 * 3 * 4);
  write_file(dir.file("a.idx"), idx_bytes({2, 3, 4}, px));
  write_file(dir.file("a.idx.gz"), gzip_stored(idx_bytes({2, 3, 4}, px)));
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    Tensor t = data::read_idx(dir.file(name));
    EXPECT_EQ(t.dtype(), kInt32);
    EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
    EXPECT_EQ(t.to_vector<int32_t>(), std::vector<int32_t>(px.begin(), px.end())) << name;
    Tensor f = data::read_idx(dir.file(name), kFloat64);
    EXPECT_EQ(f.to_vector<double>(), std::vector<double>(px.begin(), px.end())) << name;
  }
  // Larger than one stored block and one read buffer.
  const std::vector<uint8_t> big = pixel_pattern(300 * 28 * 28);
  write_file(dir.file("big.gz"), gzip_stored(idx_bytes({300, 28, 28}, big)));
  EXPECT_EQ(data::read_idx(dir.file("big.gz"), kInt64).to_vector<int64_t>(), std::vector<int64_t>(big.begin(), big.end()));
}

TEST(ReadIdx, BadFilesGiveErrorsNamingTheFile) {
  TempDir dir;
  const std::string good = idx_bytes({2, 3, 4}, pixel_pattern(24));
  auto expect_error = [&](const std::string& name, const std::string& bytes, const std::string& part) {
    write_file(dir.file(name), bytes);
    const std::string msg = error_of([&] { data::read_idx(dir.file(name)); });
    EXPECT_CONTAINS(msg, dir.file(name));
    EXPECT_CONTAINS(msg, part);
  };
  expect_error("short_header", good.substr(0, 9), "truncated: expected 12 bytes of the IDX sizes");
  expect_error("short_data", good.substr(0, good.size() - 1), "truncated");
  expect_error("empty", "", "truncated");
  expect_error("magic", "\x01\x02" + good.substr(2), "not an IDX file");
  expect_error("trailing", good + "x", "unexpected data after");
  // Sizes whose product overflows 64 bits, and sizes beyond the file: refused before allocating.
  expect_error("huge", idx_bytes({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {1, 2, 3}), "more values than the file can hold");
  expect_error("large", idx_bytes({1000, 1000}, {1, 2, 3}), "more values than the file can hold");
  expect_error("gz_cut", gzip_stored(good).substr(0, 30), "truncated");
  std::string bad_crc = gzip_stored(good);
  bad_crc[bad_crc.size() - 6] ^= 1;
  expect_error("gz_crc", bad_crc, "corrupt compressed data");
  write_file(dir.file("ints"), idx_bytes({2}, {0, 0, 0, 1, 0, 0, 0, 2}, 0x0C));
  EXPECT_CONTAINS(error_of<NotImplementedError>([&] { data::read_idx(dir.file("ints")); }), "IDX type code 12");
  EXPECT_CONTAINS(error_of([&] { data::read_idx(dir.file("missing")); }), "cannot open");
  EXPECT_CONTAINS(error_of([&] { data::read_idx(dir.path()); }), "not a regular file");
  EXPECT_CONTAINS(error_of<TypeError>([&] { data::read_idx(dir.file("ints"), kBool); }), "dtype must be");
}

TEST(LoadMnist, ScalesImagesAndChecksLabels) {
  TempDir dir;
  const std::vector<uint8_t> px = pixel_pattern(3 * 2 * 2);
  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes({3, 2, 2}, px));
  write_file(dir.file("t10k-labels-idx1-ubyte.gz"), gzip_stored(idx_bytes({3}, {7, 0, 9})));
  auto ds = data::load_mnist(dir.path(), false);
  EXPECT_EQ(ds->inputs().shape(), (Shape{3, 1, 2, 2}));
  EXPECT_EQ(ds->inputs().dtype(), kFloat32);
  const std::vector<float> xs = ds->inputs().to_vector<float>();
  for (size_t i = 0; i < px.size(); ++i) EXPECT_EQ(xs[i], static_cast<float>(px[i]) / 255.0f) << i;
  EXPECT_EQ(ds->targets().to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));

  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({3}, {7, 10, 9}));  // the plain file wins
  EXPECT_CONTAINS(error_of([&] { data::load_mnist(dir.path(), false); }), "label 10 of example 1 is not in 0..9");
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, {7, 1}));
  EXPECT_CONTAINS(error_of([&] { data::load_mnist(dir.path(), false); }), "2 labels for 3 images");
  EXPECT_CONTAINS(error_of([&] { data::load_mnist(dir.path(), true); }),
                  "neither '" + dir.file("train-images-idx3-ubyte") + "' nor '" + dir.file("train-images-idx3-ubyte") + ".gz'");
}

// ---- reference data from NumPy and gzip ----

std::map<std::string, std::vector<std::string>> reference_lines(const std::string& kind) {
  std::ifstream in(std::string(braid::test::data_dir()) + "/data_reference.txt");
  EXPECT_TRUE(in.good()) << "run tests/data/make_data_reference.py";
  std::map<std::string, std::vector<std::string>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string k, name, w;
    ss >> k >> name;
    if (k != kind) continue;
    while (ss >> w) out[name].push_back(w);
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return s;
}

Shape parse_shape(const std::string& s) {
  Shape shape;
  if (s == "-") return shape;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ',');) shape.push_back(std::stoll(part));
  return shape;
}

TEST(Npy, ReadsWhatNumpyWroteAndWritesItBackByteForByte) {
  TempDir dir;
  auto cases = reference_lines("npy");
  for (const auto& [name, words] : reference_lines("npy_v2")) cases[name] = words;
  ASSERT_EQ(cases.size(), 13u);
  for (const auto& [name, w] : cases) {
    SCOPED_TRACE(name);
    const std::string bytes = unhex(w[2]);
    write_file(dir.file(name), bytes);
    Tensor t = data::read_npy(dir.file(name));
    EXPECT_EQ(dtype_name(t.dtype()), w[0]);
    EXPECT_EQ(t.shape(), parse_shape(w[1]));
    ASSERT_EQ(static_cast<size_t>(t.numel()), w.size() - 3);
    if (t.dtype() == kInt64 || t.dtype() == kInt32 || t.dtype() == kBool) {
      const std::vector<int64_t> v = t.to_vector<int64_t>();
      for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], std::stoll(w[3 + i])) << i;
    } else {
      const std::vector<double> v = t.to_vector<double>();
      for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], std::stod(w[3 + i])) << i;
    }
    if (name == "u1_5" || name == "f4_1x2_v2") continue;  // read as int32 / written as version 1.0
    data::write_npy(dir.file(name + ".out"), t);
    EXPECT_EQ(read_file(dir.file(name + ".out")), bytes);
  }
}

// The .npy file with its shape (3, 2) replaced, the header keeping its length (numpy leaves spare
// spaces before the final newline for this).
std::string with_shape(std::string npy, const std::string& shape) {
  npy.replace(npy.find("(3, 2)"), 6, shape);
  const size_t grown = shape.size() - 6;
  npy.erase(npy.find('\n') - grown, grown);
  return npy;
}

TEST(Npy, RefusesWhatItDoesNotSupportNamingTheFile) {
  TempDir dir;
  const auto rejects = reference_lines("npy_reject");
  ASSERT_EQ(rejects.size(), 5u);
  for (const auto& [name, w] : rejects) {
    write_file(dir.file(name), unhex(w[1]));
    const std::string msg = error_of([&] { data::read_npy(dir.file(name)); });
    EXPECT_CONTAINS(msg, dir.file(name));
    EXPECT_CONTAINS(msg, w[0]);
  }
  EXPECT_CONTAINS(error_of<NotImplementedError>([&] { data::read_npy(dir.file("fortran")); }), "ascontiguousarray");
  EXPECT_CONTAINS(error_of<TypeError>([&] { data::read_npy(dir.file("complex")); }), "supported: <f2, <f4");

  const std::string good = unhex(reference_lines("npy").at("i4_3x2")[2]);  // 128-byte header, 24 bytes of data
  auto expect_error = [&](const std::string& name, const std::string& bytes, const std::string& part) {
    write_file(dir.file(name), bytes);
    const std::string msg = error_of([&] { data::read_npy(dir.file(name)); });
    EXPECT_CONTAINS(msg, dir.file(name));
    EXPECT_CONTAINS(msg, part);
  };
  expect_error("cut_data", good.substr(0, good.size() - 3), "truncated or corrupt: shape [3, 2] of <i4 needs more bytes");
  expect_error("cut_header", good.substr(0, 50), "truncated");
  expect_error("trailing", good + "?", "unexpected data after the array data");
  expect_error("magic", "\x93NUMPZ" + good.substr(6), "not a .npy file");
  std::string v9 = good;
  v9[6] = 9;
  expect_error("version", v9, "format version 9.0 is not supported");
  expect_error("huge_shape", with_shape(good, "(99999, 99999)"), "needs more bytes than the file holds");
  expect_error("overflow", with_shape(good, "(4611686018427387904, 8)"), "needs more bytes than the file holds");
  std::string b1 = unhex(reference_lines("npy").at("b1_2x2")[2]);
  b1.back() = 2;
  expect_error("bad_bool", b1, "bool element 3 has byte value 2");
  std::string garbled = good;
  garbled.replace(garbled.find("'shape'"), 7, "'shapE'");
  expect_error("garbled", garbled, "malformed .npy header: unknown key 'shapE'");
  EXPECT_CONTAINS(error_of<TypeError>([&] { data::write_npy(dir.file("bf"), zeros({2}, kBFloat16)); }),
                  "bfloat16 has no NumPy dtype");
  EXPECT_CONTAINS(error_of([&] { data::write_npy(dir.file("no/such/dir.npy"), zeros({2})); }), "cannot create");
}

TEST(Npy, RoundTripsNonContiguousTensors) {
  TempDir dir;
  Tensor t = arange(0.0, 12.0, 1.0, kFloat64).reshape({3, 4}).transpose(0, 1);
  data::write_npy(dir.file("t.npy"), t);
  Tensor back = data::read_npy(dir.file("t.npy"));
  EXPECT_TRUE(equal(back, t.contiguous()));
  EXPECT_EQ(back.to_vector<double>()[1], 4.0);  // row 0 of the transpose is column 0: 0, 4, 8
}

TEST(FashionMnist, TheRealDataMatchesNumpy) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed (" << dir << ")";
  const auto facts = reference_lines("fmnist");
  for (const std::string split : {"t10k", "train"}) {
    SCOPED_TRACE(split);
    auto fact = [&](const std::string& key) { return facts.at(split + "_" + key); };
    auto ds = data::load_mnist(dir, split == "train");
    const int64_t n = std::stoll(fact("count")[0]);
    ASSERT_EQ(ds->inputs().shape(), (Shape{n, 1, 28, 28}));
    std::vector<int64_t> counts(10, 0);
    for (int64_t l : ds->targets().to_vector<int64_t>()) ++counts.at(static_cast<size_t>(l));
    for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], std::stoll(fact("label_counts")[c])) << "class " << c;
    const std::vector<int64_t> first = ds->targets().narrow(0, 0, 10).to_vector<int64_t>();
    for (int i = 0; i < 10; ++i) EXPECT_EQ(first[i], std::stoll(fact("first_labels")[i]));
    // Pixels are v / 255 in float32, so v comes back exactly as round(x * 255).
    const std::vector<float> x = ds->inputs().to_vector<float>();
    int64_t sum = 0, lo = 255, hi = 0;
    for (float v : x) {
      const auto p = static_cast<int64_t>(std::lround(static_cast<double>(v) * 255.0));
      ASSERT_EQ(static_cast<float>(p) / 255.0f, v);
      sum += p;
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
    EXPECT_EQ(sum, std::stoll(fact("pixel_sum")[0]));
    EXPECT_EQ(lo, std::stoll(fact("pixel_min")[0]));
    EXPECT_EQ(hi, std::stoll(fact("pixel_max")[0]));
    for (int q = 0; q < 28; ++q)
      EXPECT_EQ(std::lround(x[14 * 28 + q] * 255.0), std::stoll(fact("image0_row14")[q])) << "column " << q;
    int64_t last = 0;
    for (int64_t i = (n - 1) * 784; i < n * 784; ++i) last += std::lround(x[i] * 255.0);
    EXPECT_EQ(last, std::stoll(fact("last_image_sum")[0]));
  }
}

TEST(FashionMnist, ACorruptCopyOfTheRealFileIsRefused) {
  const std::string labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(labels)) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  TempDir dir;
  const std::string bytes = read_file(labels);  // deflate-compressed, unlike gzip_stored's
  EXPECT_EQ(data::read_idx(labels).numel(), 10000);
  write_file(dir.file("cut.gz"), bytes.substr(0, bytes.size() / 2));
  EXPECT_CONTAINS(error_of([&] { data::read_idx(dir.file("cut.gz")); }), "truncated");
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x55;
  write_file(dir.file("flipped.gz"), flipped);
  const std::string msg = error_of([&] { data::read_idx(dir.file("flipped.gz")); });
  EXPECT_CONTAINS(msg, dir.file("flipped.gz"));
}

// ---- CIFAR-10 ----

std::string cifar_record(uint8_t label, uint8_t seed) {
  std::string r(1, static_cast<char>(label));
  for (int i = 0; i < 3072; ++i) r += static_cast<char>((i * 7 + seed) % 256);
  return r;
}

TEST(LoadCifar10, ReadsRecordsAsPlanes) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("cifar-10-batches-bin"));
  write_file(dir.file("cifar-10-batches-bin/test_batch.bin"), cifar_record(3, 0) + cifar_record(9, 100));
  for (int i = 1; i <= 5; ++i)
    write_file(dir.file("cifar-10-batches-bin/data_batch_" + std::to_string(i) + ".bin"), cifar_record(static_cast<uint8_t>(i), 1));
  auto test = data::load_cifar10(dir.path(), false);
  EXPECT_EQ(test->inputs().shape(), (Shape{2, 3, 32, 32}));
  EXPECT_EQ(test->targets().to_vector<int64_t>(), (std::vector<int64_t>{3, 9}));
  // Record 1, green plane (offset 1024), row 2, column 5: byte 1024 + 2 * 32 + 5 of the pixels.
  const int i = 1024 + 2 * 32 + 5;
  EXPECT_EQ(test->inputs().select(0, 1).select(0, 1).select(0, 2).select(0, 5).item(),
            static_cast<double>(static_cast<float>((i * 7 + 100) % 256) / 255.0f));
  auto train = data::load_cifar10(dir.file("cifar-10-batches-bin"), true);
  EXPECT_EQ(train->targets().to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5}));

  write_file(dir.file("cifar-10-batches-bin/test_batch.bin"), cifar_record(3, 0).substr(0, 3000));
  EXPECT_CONTAINS(error_of([&] { data::load_cifar10(dir.path(), false); }), "size 3000 is not a positive multiple of the record size 3073");
  write_file(dir.file("cifar-10-batches-bin/test_batch.bin"), cifar_record(3, 0) + cifar_record(12, 0));
  EXPECT_CONTAINS(error_of([&] { data::load_cifar10(dir.path(), false); }), "label 12 of record 1");
  std::filesystem::remove(dir.file("cifar-10-batches-bin/data_batch_4.bin"));
  EXPECT_CONTAINS(error_of([&] { data::load_cifar10(dir.path(), true); }), "data_batch_4.bin' does not exist");
}

// ---- CSV ----

TEST(ReadCsv, ParsesNumbersWithHeaderSpacesAndCrlf) {
  TempDir dir;
  write_file(dir.file("a.csv"), "x, y ,z\r\n1,2.5,-3\r\n +4e2 , 0.1,1e-3\r\n\r\n-0,7,8\n");
  Tensor t = data::read_csv(dir.file("a.csv"), true);
  EXPECT_EQ(t.shape(), (Shape{3, 3}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2.5f, -3, 400, 0.1f, 1e-3f, -0.0f, 7, 8}));
  write_file(dir.file("b.csv"), "1,2\n3,4");  // no final newline, no header
  EXPECT_EQ(data::read_csv(dir.file("b.csv")).to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(ReadCsv, ErrorsNameFileLineAndColumn) {
  TempDir dir;
  write_file(dir.file("bad.csv"), "a,b\n1,2\n3,4x\n");
  const std::string msg = error_of([&] { data::read_csv(dir.file("bad.csv"), true); });
  EXPECT_CONTAINS(msg, dir.file("bad.csv"));
  EXPECT_CONTAINS(msg, "line 3, column 2: '4x' is not a number");
  write_file(dir.file("empty_field.csv"), "1,,3\n");
  EXPECT_CONTAINS(error_of([&] { data::read_csv(dir.file("empty_field.csv")); }), "line 1, column 2: '' is not a number");
  write_file(dir.file("ragged.csv"), "1,2,3\n4,5\n");
  EXPECT_CONTAINS(error_of([&] { data::read_csv(dir.file("ragged.csv")); }), "line 2 has 2 columns, but line 1 has 3");
  write_file(dir.file("header_only.csv"), "a,b\n");
  EXPECT_CONTAINS(error_of([&] { data::read_csv(dir.file("header_only.csv"), true); }), "no data rows");
}

}  // namespace
}  // namespace braid
