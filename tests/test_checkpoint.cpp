// Tests of braid/checkpoint.h: the file layout against bytes built by hand (Note [Checkpoint
// format]) with an independent CRC-32; bitwise round trips of every dtype; truncated, bit-flipped
// and crafted files; a writer killed mid-write (SIGXFSZ) leaving the previous checkpoint intact;
// restores that refuse a mismatching model without changing it; and training resumed from step k
// that ends bitwise where uninterrupted training ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "braid/braid.h"
#include "error_of.h"
#include "braid/checkpoint.h"
#include "braid/data.h"
#include "braid/nn/loss.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"

namespace braid {
namespace {

// ---- helpers ----

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "braid-ckpt-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

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

// CRC-32 (IEEE 802.3, reflected), bit by bit: independent of zlib.
uint32_t crc32_ref(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// Little-endian bytes of an integer or double.
template <typename T>
std::string le(T v) {
  std::string s(sizeof v, '\0');
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  for (size_t i = 0; i < sizeof v; ++i) s[i] = static_cast<char>(bits >> (8 * i));
  return s;
}

std::string name_bytes(const std::string& n) { return le<uint32_t>(static_cast<uint32_t>(n.size())) + n; }

// A whole file around payload: header with the right magic, version, CRC and size.
std::string file_with_payload(const std::string& payload) {
  return std::string("BRAIDCKP") + le<uint32_t>(1) + le<uint32_t>(crc32_ref(payload)) + le<uint64_t>(payload.size()) + payload;
}

template <typename T>
Tensor from_values(const std::vector<T>& v, const Shape& shape, DType dtype) {
  return from_buffer(v.data(), shape, dtype);
}

// One tensor of every dtype, with the awkward values: NaN payloads, -0, infinities, denormals,
// extreme integers; a non-contiguous view, a 0-d and an empty tensor.
Checkpoint every_dtype() {
  Checkpoint c;
  const float fnan = std::bit_cast<float>(0x7fc12345u);
  c.tensors["f32"] = tensor(std::vector<float>{fnan, -0.0f, INFINITY, 1e-45f, -3.25f, 1.0f / 3.0f}, {2, 3});
  c.tensors["f64"] = tensor(std::vector<double>{std::bit_cast<double>(0x7ff8000000000abcull), -0.0, -INFINITY, 5e-324}, {4});
  c.tensors["i64"] = tensor(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 0}, {3, 1});
  c.tensors["i32"] = tensor(std::vector<int32_t>{-7, std::numeric_limits<int32_t>::max()}, {1, 2});
  c.tensors["bool"] = tensor_bool({true, false, false, true, true}, {5});
  c.tensors["f16"] = from_values<uint16_t>({0x3c00, 0x7e01, 0x8000, 0x0001}, {2, 2}, kFloat16);
  c.tensors["bf16"] = from_values<uint16_t>({0x3f80, 0xffc1, 0x0080}, {3}, kBFloat16);
  c.tensors["view"] = arange(0.0, 12.0, 1.0, kFloat32).reshape({3, 4}).transpose(0, 1);
  c.tensors["scalar"] = scalar_tensor(2.5, kFloat64);
  c.tensors["empty"] = zeros({0, 5}, kInt32);
  c.scalars["lr"] = 0.1;
  c.scalars["nan"] = std::bit_cast<double>(0x7ff800000000dcbaull);
  c.scalars["tiny"] = 5e-324;
  c.integers["min"] = std::numeric_limits<int64_t>::min();
  c.integers["seed"] = static_cast<int64_t>(0xfedcba9876543210ull);
  c.strings["empty"] = "";
  c.strings["bytes"] = std::string("a\0b\xff\n", 5);
  return c;
}

void expect_bitwise_equal(const Checkpoint& a, const Checkpoint& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << name;
    EXPECT_TRUE(equal(b.tensors.at(name), t.contiguous())) << name;  // shape, dtype and bytes
  }
  ASSERT_EQ(a.scalars.size(), b.scalars.size());
  for (const auto& [name, v] : a.scalars)
    EXPECT_EQ(std::bit_cast<uint64_t>(b.scalars.at(name)), std::bit_cast<uint64_t>(v)) << name;
  EXPECT_EQ(a.integers, b.integers);
  EXPECT_EQ(a.strings, b.strings);
}

// ---- the file ----

TEST(CheckpointFile, RoundTripsEveryDtypeBitwise) {
  TempDir dir;
  const Checkpoint c = every_dtype();
  save_checkpoint(dir.file("c.ckpt"), c);
  const Checkpoint back = load_checkpoint(dir.file("c.ckpt"));
  expect_bitwise_equal(c, back);
  EXPECT_EQ(back.source, dir.file("c.ckpt"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("c.ckpt.tmp-" + std::to_string(::getpid()))));
  save_checkpoint(dir.file("empty.ckpt"), Checkpoint());
  EXPECT_EQ(read_file(dir.file("empty.ckpt")).size(), 24u + 4 * 8);  // header and four zero counts
  expect_bitwise_equal(Checkpoint(), load_checkpoint(dir.file("empty.ckpt")));
}

TEST(CheckpointFile, LayoutIsTheDocumentedOne) {
  TempDir dir;
  Checkpoint c;
  c.tensors["w"] = tensor(std::vector<float>{1.5f, -2.0f}, {2, 1});
  c.scalars["lr"] = 0.5;
  c.integers["step"] = -7;
  c.strings["name"] = "mlp";
  save_checkpoint(dir.file("c"), c);
  const std::string payload = le<uint64_t>(1) + name_bytes("w") + std::string(1, '\x01') + le<uint32_t>(2) + le<int64_t>(2) +
                              le<int64_t>(1) + le(1.5f) + le(-2.0f) + le<uint64_t>(1) + name_bytes("lr") + le(0.5) +
                              le<uint64_t>(1) + name_bytes("step") + le<int64_t>(-7) + le<uint64_t>(1) + name_bytes("name") +
                              le<uint64_t>(3) + "mlp";
  EXPECT_EQ(read_file(dir.file("c")), file_with_payload(payload));
}

TEST(CheckpointFile, TruncationAtEvery97thByteIsAnErrorNamingTheFile) {
  TempDir dir;
  save_checkpoint(dir.file("good"), every_dtype());
  const std::string bytes = read_file(dir.file("good"));
  ASSERT_GT(bytes.size(), 400u);
  int cases = 0;
  for (size_t n = 0; n < bytes.size(); n += 97, ++cases) {
    write_file(dir.file("cut"), bytes.substr(0, n));
    const std::string msg = error_of([&] { load_checkpoint(dir.file("cut")); });
    EXPECT_CONTAINS(msg, "load_checkpoint '" + dir.file("cut") + "'");
    EXPECT_CONTAINS(msg, "truncated");
  }
  EXPECT_GE(cases, 5);
  write_file(dir.file("long"), bytes + "x");
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("long")); }), "trailing data");
}

TEST(CheckpointFile, FlippedBitsAndWrongFilesAreErrorsNamingTheFile) {
  TempDir dir;
  save_checkpoint(dir.file("good"), every_dtype());
  const std::string bytes = read_file(dir.file("good"));
  for (size_t at = 0; at < bytes.size(); at += (at < 24 ? 1 : 13)) {
    std::string bad = bytes;
    bad[at] ^= static_cast<char>(1 << (at % 8));
    write_file(dir.file("bad"), bad);
    const std::string msg = error_of([&] { load_checkpoint(dir.file("bad")); });
    EXPECT_CONTAINS(msg, dir.file("bad"));
    const char* expect = at < 8 ? "bad magic" : at < 12 ? "format version" : at < 16 ? "checksum mismatch"
                       : at < 24 ? "payload of" : "checksum mismatch";
    EXPECT_CONTAINS(msg, expect) << "byte " << at;
  }
  write_file(dir.file("text"), "hello, this is not a checkpoint at all");
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("text")); }), "not a braid checkpoint (bad magic number)");
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.file("absent")); }), "load_checkpoint '" + dir.file("absent") + "': cannot open");
}

// Files whose CRC is right but whose sizes are absurd: refused before anything is allocated.
TEST(CheckpointFile, CraftedSizesAreRefusedWithoutAllocating) {
  TempDir dir;
  const std::string tail = le<uint64_t>(0) + le<uint64_t>(0) + le<uint64_t>(0);  // empty scalars, integers, strings
  auto expect_error = [&](const std::string& payload, const std::string& part) {
    write_file(dir.file("x"), file_with_payload(payload));
    const std::string msg = error_of([&] { load_checkpoint(dir.file("x")); });
    EXPECT_CONTAINS(msg, dir.file("x"));
    EXPECT_CONTAINS(msg, part);
  };
  const std::string w = le<uint64_t>(1) + name_bytes("w");
  expect_error(le<uint64_t>(1ull << 62) + tail, "corrupt payload: 4611686018427387904 tensors");
  expect_error(w + "\x01" + le<uint32_t>(3) + le<int64_t>(1ll << 40) + le<int64_t>(1ll << 40) + le<int64_t>(1ll << 40) + tail,
               "tensor 'w' claims shape [1099511627776]...");
  expect_error(w + "\x02" + le<uint32_t>(1) + le<int64_t>(-1) + tail, "tensor 'w' claims shape [-1]");
  expect_error(w + "\x01" + le<uint32_t>(0x7fffffff) + tail, "claims 2147483647 dimensions");
  expect_error(w + "\x63" + le<uint32_t>(0) + tail, "unknown dtype code 99");
  expect_error(w + "\x05" + le<uint32_t>(1) + le<int64_t>(2) + std::string("\x01\x02", 2) + tail, "bool tensor 'w' holds byte value 2");
  expect_error(le<uint64_t>(0) + le<uint64_t>(2) + name_bytes("a") + le(1.0) + name_bytes("a") + le(2.0) + le<uint64_t>(0) +
                   le<uint64_t>(0), "duplicate scalars 'a'");
  expect_error(le<uint64_t>(0) + le<uint64_t>(0) + le<uint64_t>(0) + le<uint64_t>(1) + name_bytes("s") + le<uint64_t>(1ull << 60),
               "a string needs 1152921504606846976 bytes");
  expect_error(le<uint64_t>(0) + tail + "?", "1 bytes after the last section");
  expect_error(le<uint64_t>(0) + le<uint64_t>(0), "a section count needs 8 bytes, 0 left");
}

TEST(CheckpointFile, SavingReplacesAndAFailedSaveKeepsThePrevious) {
  TempDir dir;
  const std::string path = dir.file("c");
  Checkpoint one;
  one.integers["v"] = 1;
  Checkpoint two;
  two.integers["v"] = 2;
  save_checkpoint(path, one);
  save_checkpoint(path, two);
  EXPECT_EQ(load_checkpoint(path).integer("v"), 2);
  // The directory is gone: an error naming the path.
  std::filesystem::create_directory(dir.file("sub"));
  save_checkpoint(dir.file("sub/c"), one);
  std::filesystem::remove_all(dir.file("sub"));
  EXPECT_CONTAINS(error_of([&] { save_checkpoint(dir.file("sub/c"), two); }), "save_checkpoint '" + dir.file("sub/c") + "': cannot create");
  Checkpoint undefined;
  undefined.tensors["t"] = Tensor();
  EXPECT_CONTAINS(error_of<ValueError>([&] { save_checkpoint(path, undefined); }), "tensor 't' is undefined");
  EXPECT_EQ(load_checkpoint(path).integer("v"), 2);
}

// Runs f in a child process whose files may not grow past 64 KiB, and returns its wait status. The
// child touches host memory only (a forked child cannot use a GPU that its parent initialised), and
// an exception in it ends it with status 3 rather than letting it run the rest of the suite.
template <typename F>
int in_child_with_small_file_limit(bool ignore_sigxfsz, F f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit core{0, 0}, size{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_CORE, &core);
    ::setrlimit(RLIMIT_FSIZE, &size);
    if (ignore_sigxfsz) ::signal(SIGXFSZ, SIG_IGN);
    try {
      ::_exit(f());
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(CheckpointFile, AWriterKilledMidWriteLeavesThePreviousCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("c");
  const Checkpoint old = every_dtype();
  save_checkpoint(path, old);
  Checkpoint big;
  big.tensors["w"] =
      zeros({1 << 18}, kFloat32, cpu());  // 1 MiB: the write passes the 64 KiB limit and SIGXFSZ kills the writer
  int status = in_child_with_small_file_limit(false, [&] {
    save_checkpoint(path, big);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGXFSZ);
  expect_bitwise_equal(old, load_checkpoint(path));

  // With SIGXFSZ ignored the write fails with EFBIG instead: an error naming the path, and the
  // temporary file removed.
  status = in_child_with_small_file_limit(true, [&] {
    try {
      save_checkpoint(path, big);
    } catch (const Error& e) {
      const std::string msg = e.what(), tmp = path + ".tmp-" + std::to_string(::getpid());
      if (msg.find("save_checkpoint '" + path + "'") == std::string::npos) return 2;
      if (msg.find(std::strerror(EFBIG)) == std::string::npos) return 3;
      return std::filesystem::exists(tmp) ? 4 : 0;
    }
    return 1;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error, 2: path not named, 3: not EFBIG, 4: temporary file left";
  expect_bitwise_equal(old, load_checkpoint(path));
}

TEST(CheckpointFile, MissingEntriesAreIndexErrorsListingNeighbours) {
  Checkpoint c;
  c.source = "/x/run.ckpt";
  c.integers["loader.epoch"] = 1;
  c.integers["loader.batch"] = 2;
  const std::string msg = error_of<IndexError>([&] { c.integer("loader.epoc"); });
  EXPECT_CONTAINS(msg, "checkpoint '/x/run.ckpt': no integer 'loader.epoc'");
  EXPECT_CONTAINS(msg, "loader.batch, loader.epoch");
  EXPECT_CONTAINS(error_of<IndexError>([&] { c.tensor("w"); }), "no tensor 'w'");
}

// ---- restoring objects ----

std::shared_ptr<nn::Sequential> mlp(int64_t out, uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(4, 3)).add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(3, out));
  return m;
}

std::map<std::string, Tensor> snapshot(const nn::Module& m) {
  std::map<std::string, Tensor> s;
  for (const auto& [name, t] : m.state_dict()) s[name] = t.clone();
  return s;
}

void expect_unchanged(const nn::Module& m, const std::map<std::string, Tensor>& before) {
  for (const auto& [name, t] : m.state_dict()) EXPECT_TRUE(equal(t, before.at(name))) << name << " changed";
}

TEST(CheckpointRestore, ModuleLoadsExactlyOrNotAtAll) {
  TempDir dir;
  auto saved = mlp(2, 1);
  Checkpoint c;
  store_state(c, "model.", *saved);
  save_checkpoint(dir.file("m"), c);
  const Checkpoint loaded = load_checkpoint(dir.file("m"));
  EXPECT_EQ(loaded.tensors.size(), 4u);

  auto same = mlp(2, 2);
  restore_state(loaded, "model.", *same);
  for (const auto& [name, t] : saved->state_dict()) EXPECT_TRUE(equal(same->state_dict().at(name), t)) << name;

  // Another head: the first mismatching tensor in name order is 2.bias; nothing is loaded.
  auto other = mlp(5, 3);
  auto before = snapshot(*other);
  std::string msg = error_of<ValueError>([&] { restore_state(loaded, "model.", *other); });
  EXPECT_CONTAINS(msg, "checkpoint '" + dir.file("m") + "': tensor 'model.2.bias' is float32 [2] but the model's '2.bias' is float32 [5]");
  expect_unchanged(*other, before);

  Checkpoint missing = loaded;
  missing.tensors.erase("model.0.bias");
  msg = error_of<ValueError>([&] { restore_state(missing, "model.", *other); });
  EXPECT_CONTAINS(msg, "no tensor 'model.0.bias' for the model's 0.bias");
  Checkpoint extra = loaded;
  extra.tensors["model.9.weight"] = zeros({1});
  msg = error_of<ValueError>([&] { restore_state(extra, "model.", *same); });
  EXPECT_CONTAINS(msg, "unexpected tensor 'model.9.weight'");
  auto wide = mlp(2, 4);
  wide->to(kFloat64);
  before = snapshot(*wide);
  msg = error_of<ValueError>([&] { restore_state(loaded, "model.", *wide); });
  EXPECT_CONTAINS(msg, "tensor 'model.0.bias' is float32 [3] but the model's '0.bias' is float64 [3]");
  expect_unchanged(*wide, before);
}

TEST(CheckpointRestore, OptimizerSchedulerGeneratorAndLoader) {
  TempDir dir;
  auto model = mlp(2, 1);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::StepLR sched(sgd, 2, 0.5);
  Generator gen(0xfffffffffffffff0ull);
  gen.advance(12345);
  data::DataLoader loader(std::make_shared<data::TensorDataset>(zeros({10, 2}), arange(10)), {.batch_size = 3});
  loader.seek(2, 3);
  for (int i = 0; i < 3; ++i) {
    sum((*model)(ones({2, 4}))).backward();
    sgd.step();
    sched.step();
  }
  Checkpoint c;
  store_state(c, "optim.", sgd);
  store_state(c, "sched.", sched);
  store_state(c, "rng.", gen);
  store_state(c, "loader.", loader);
  save_checkpoint(dir.file("c"), c);
  const Checkpoint back = load_checkpoint(dir.file("c"));

  auto model2 = mlp(2, 9);
  optim::SGD sgd2(model2->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::StepLR sched2(sgd2, 2, 0.5);
  restore_state(back, "optim.", sgd2);
  restore_state(back, "sched.", sched2);
  const optim::OptimizerState a = sgd.state_dict(), b = sgd2.state_dict();
  EXPECT_EQ(a.scalars, b.scalars);
  ASSERT_EQ(a.tensors.size(), 4u);  // a momentum buffer per parameter
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(equal(b.tensors.at(name), t)) << name;
  EXPECT_EQ(sched2.last_epoch(), 3);
  EXPECT_EQ(sgd2.param_groups()[0].lr(), 0.1 * 0.5);  // StepLR(2, 0.5) after 3 steps

  Generator gen2;
  restore_state(back, "rng.", gen2);
  EXPECT_EQ(gen2.seed(), 0xfffffffffffffff0ull);
  EXPECT_EQ(gen2.offset(), 12345u);
  data::DataLoader loader2(std::make_shared<data::TensorDataset>(zeros({10, 2}), arange(10)), {.batch_size = 3});
  restore_state(back, "loader.", loader2);
  EXPECT_EQ(loader2.epoch(), 2);
  EXPECT_EQ(loader2.batch(), 3);

  // Wrong objects: errors that name the file, and nothing restored.
  optim::Adam adam(model2->parameters());
  EXPECT_CONTAINS(error_of<ValueError>([&] { restore_state(back, "optim.", adam); }), "checkpoint '" + dir.file("c") + "': ");
  EXPECT_EQ(adam.state_dict().tensors.size(), 0u);
  data::DataLoader small(std::make_shared<data::TensorDataset>(zeros({4, 2}), arange(4)), {.batch_size = 3});
  EXPECT_CONTAINS(error_of<IndexError>([&] { restore_state(back, "loader.", small); }), "checkpoint '" + dir.file("c") + "': DataLoader::seek");
  EXPECT_EQ(small.batch(), 0);
}

// ---- resume equals uninterrupted ----

// A small image classifier trained with dropout (default generator), a shuffled, augmented,
// prefetching loader and a learning-rate schedule: every piece of state a resume must restore.
struct Trainer {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LRScheduler> sched;
  std::unique_ptr<data::DataLoader> loader;
  int64_t step = 0;
};

std::shared_ptr<data::TensorDataset> toy_images() {
  Generator g(123);
  return std::make_shared<data::TensorDataset>(rand({37, 1, 4, 4}, kFloat32, &g), randint(0, 3, {37}, kInt64, &g));
}

Trainer make_run(bool adam, uint64_t init_seed) {
  manual_seed(init_seed);
  Trainer r;
  r.model = std::make_shared<nn::Sequential>();
  r.model->add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(16, 12))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Dropout>(0.3))
      .add(std::make_shared<nn::Linear>(12, 3));
  if (adam) {
    r.opt = std::make_unique<optim::Adam>(r.model->parameters(), optim::AdamOptions{.lr = 0.01});
    r.sched = std::make_unique<optim::CosineWithWarmup>(*r.opt, 3, 14);
  } else {
    r.opt = std::make_unique<optim::SGD>(r.model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    r.sched = std::make_unique<optim::StepLR>(*r.opt, 4, 0.5);
  }
  data::DataLoaderOptions o{.batch_size = 8, .shuffle = true, .seed = 99, .prefetch = 2};
  o.transforms = {std::make_shared<data::RandomHorizontalFlip>(), std::make_shared<data::RandomCrop>(4, 1)};
  r.loader = std::make_unique<data::DataLoader>(toy_images(), o);
  return r;
}

void train(Trainer& r, int64_t until) {
  data::Batch b;
  while (r.step < until) {
    if (!r.loader->next(b)) continue;  // end of an epoch
    Tensor loss = nn::cross_entropy((*r.model)(b.input), b.target);
    r.opt->zero_grad();
    loss.backward();
    r.opt->step();
    r.sched->step();
    ++r.step;
  }
}

Checkpoint capture(const Trainer& r) {
  Checkpoint c;
  store_state(c, "model.", *r.model);
  store_state(c, "optim.", *r.opt);
  store_state(c, "sched.", *r.sched);
  store_state(c, "rng.", default_generator());
  store_state(c, "loader.", *r.loader);
  c.integers["step"] = r.step;
  return c;
}

bool same_weights(const Trainer& a, const Trainer& b) {
  bool same = true;
  for (const auto& [name, t] : a.model->state_dict()) same &= equal(b.model->state_dict().at(name), t);
  return same;
}

class Resume : public ::testing::TestWithParam<bool> {};

TEST_P(Resume, FromStepKEqualsUninterruptedTrainingBitwise) {
  const bool adam = GetParam();
  const int64_t k = 7, n = 13;  // 5 batches per epoch: k is mid-epoch 1, n in epoch 2
  TempDir dir;

  Trainer whole = make_run(adam, 1);
  train(whole, n);

  Trainer first = make_run(adam, 1);
  train(first, k);
  save_checkpoint(dir.file("k.ckpt"), capture(first));
  first = Trainer();  // nothing survives but the file

  auto resume = [&](bool restore_rng) {
    Trainer r = make_run(adam, 2);  // another initialisation, which the checkpoint must overwrite
    manual_seed(777);           // and another RNG state
    const Checkpoint c = load_checkpoint(dir.file("k.ckpt"));
    restore_state(c, "model.", *r.model);
    restore_state(c, "optim.", *r.opt);
    restore_state(c, "sched.", *r.sched);
    if (restore_rng) restore_state(c, "rng.", default_generator());
    restore_state(c, "loader.", *r.loader);
    r.step = c.integer("step");
    EXPECT_EQ(r.loader->epoch(), 1);
    EXPECT_EQ(r.loader->batch(), 2);
    train(r, n);
    return r;
  };
  EXPECT_FALSE(same_weights(whole, make_run(adam, 1))) << "training did not change the weights";
  Trainer resumed = resume(true);
  EXPECT_TRUE(same_weights(whole, resumed)) << "resumed training differs from uninterrupted training";
  const optim::OptimizerState a = whole.opt->state_dict(), b = resumed.opt->state_dict();
  EXPECT_EQ(a.scalars, b.scalars);
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(equal(b.tensors.at(name), t)) << name;
  EXPECT_EQ(whole.sched->get_last_lr(), resumed.sched->get_last_lr());
  // The test can tell: without the RNG state, dropout draws other masks and the weights differ.
  EXPECT_FALSE(same_weights(whole, resume(false)));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Resume, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Adam" : "SGDMomentum"; });

}  // namespace
}  // namespace braid
