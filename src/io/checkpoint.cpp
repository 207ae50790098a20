// The checkpoint file format, its atomic writer and validating reader, and the helpers that store
// and restore the state of modules, optimizers, schedulers, generators and data loaders.
#include "braid/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "braid/autograd.h"
#include "braid/data/loader.h"
#include "braid/nn/module.h"
#include "braid/ops.h"
#include "braid/optim/grad_scaler.h"
#include "braid/optim/lr_scheduler.h"
#include "braid/optim/optimizer.h"
#include "braid/random.h"

namespace braid {
namespace {

// Note [Checkpoint format]
// All numbers little-endian.
//   header (24 bytes): magic "BRAIDCKP", u32 version (1), u32 CRC32 of the payload, u64 payload size
//   payload: four sections, each a u64 count and that many entries, names sorted:
//     tensors   name, u8 dtype code, u32 ndim, i64 sizes[ndim], the values in row-major order
//     scalars   name, f64
//     integers  name, i64
//     strings   name, u64 length, bytes
//   where a name is a u32 length and its bytes.
// The reader checks the header, then the payload size against the file size, then the CRC, and
// only then parses; every count and size is checked against the bytes that remain, so a crafted
// header cannot make it allocate more than the file holds. Tensor data is raw little-endian memory.
static_assert(std::endian::native == std::endian::little, "the checkpoint format stores raw little-endian tensors");

constexpr char kMagic[8] = {'B', 'R', 'A', 'I', 'D', 'C', 'K', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 24;

// Stable codes, independent of the DType enum's order.
constexpr DType kDTypeCodes[] = {kFloat32, kFloat64, kInt64, kInt32, kBool, kFloat16, kBFloat16, kInt8, kUInt8};

uint8_t dtype_code(DType t) {
  for (size_t i = 0; i < std::size(kDTypeCodes); ++i)
    if (kDTypeCodes[i] == t) return static_cast<uint8_t>(i + 1);
  BRAID_ASSERT(false, "checkpoint: dtype without a code");
}

uint32_t crc32_of(uint32_t crc, const void* data, uint64_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib's crc32 takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

std::string errno_str() { return std::strerror(errno); }

// Streams the payload to a file descriptor through a buffer, keeping its CRC and size.
class Writer {
 public:
  Writer(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kBuffer); }
  void bytes(const void* data, uint64_t n) {
    crc_ = crc32_of(crc_, data, n);
    size_ += n;
    if (buf_.size() + n > kBuffer) flush();
    if (n >= kBuffer) return write_all(data, n);
    const auto* p = static_cast<const char*>(data);
    buf_.insert(buf_.end(), p, p + n);
  }
  template <typename T>
  void number(T v) {
    bytes(&v, sizeof v);  // little-endian (static_assert above)
  }
  void name(const std::string& s) {
    BRAID_CHECK(s.size() <= UINT32_MAX, "save_checkpoint: name of ", s.size(), " bytes is too long");
    number(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  uint32_t crc() const { return crc_; }
  uint64_t size() const { return size_; }

 private:
  static constexpr size_t kBuffer = 1 << 20;
  void write_all(const void* data, uint64_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<uint64_t>(n, 1u << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw Error("write '" + path_ + "': " + errno_str());
      p += w;
      n -= static_cast<uint64_t>(w);
    }
  }
  int fd_;
  std::string path_;
  std::vector<char> buf_;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
};

void write_payload(Writer& w, const Checkpoint& c) {
  w.number<uint64_t>(c.tensors.size());
  for (const auto& [name, t] : c.tensors) {
    const Tensor data = t.detach().contiguous().cpu();  // written from any device
    w.name(name);
    w.number(dtype_code(data.dtype()));
    w.number(static_cast<uint32_t>(data.dim()));
    for (int64_t s : data.shape()) w.number(s);
    w.bytes(data.raw_data(), static_cast<uint64_t>(data.numel() * data.element_size()));
  }
  w.number<uint64_t>(c.scalars.size());
  for (const auto& [name, v] : c.scalars) {
    w.name(name);
    w.number(v);
  }
  w.number<uint64_t>(c.integers.size());
  for (const auto& [name, v] : c.integers) {
    w.name(name);
    w.number(v);
  }
  w.number<uint64_t>(c.strings.size());
  for (const auto& [name, v] : c.strings) {
    w.name(name);
    w.number<uint64_t>(v.size());
    w.bytes(v.data(), v.size());
  }
}

// Reads the validated payload; every read is checked against the bytes left.
class Reader {
 public:
  Reader(const std::string& path, const char* data, uint64_t size) : path_(path), p_(data), left_(size) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("load_checkpoint '" + path_ + "': " + what);
  }
  const char* take(uint64_t n, const char* what) {
    if (n > left_) fail(std::string("corrupt payload: ") + what + " needs " + std::to_string(n) + " bytes, " +
                        std::to_string(left_) + " left");
    const char* p = p_;
    p_ += n;
    left_ -= n;
    return p;
  }
  template <typename T>
  T number(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  std::string name() {
    const uint32_t n = number<uint32_t>("a name's length");
    return std::string(take(n, "a name"), n);
  }
  uint64_t left() const { return left_; }

 private:
  const std::string& path_;
  const char* p_;
  uint64_t left_;
};

template <typename T, typename F>
void read_section(Reader& r, std::map<std::string, T>& out, const char* kind, F read_value) {
  const uint64_t n = r.number<uint64_t>("a section count");
  if (n > r.left()) r.fail(std::string("corrupt payload: ") + std::to_string(n) + " " + kind + " in " + std::to_string(r.left()) + " bytes");
  for (uint64_t i = 0; i < n; ++i) {
    std::string name = r.name();
    T value = read_value(name);
    if (!out.emplace(name, std::move(value)).second) r.fail(std::string("duplicate ") + kind + " '" + name + "'");
  }
}

Tensor read_tensor(Reader& r, const std::string& name) {
  const uint8_t code = r.number<uint8_t>("a dtype");
  if (code < 1 || code > std::size(kDTypeCodes)) r.fail("tensor '" + name + "' has unknown dtype code " + std::to_string(code));
  const DType dtype = kDTypeCodes[code - 1];
  const uint32_t ndim = r.number<uint32_t>("a rank");
  if (ndim > r.left() / 8) r.fail("tensor '" + name + "' claims " + std::to_string(ndim) + " dimensions");
  Shape shape(ndim);
  uint64_t nbytes = static_cast<uint64_t>(dtype_size(dtype));
  for (uint32_t d = 0; d < ndim; ++d) {
    shape[d] = r.number<int64_t>("a size");
    if (shape[d] < 0 || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(shape[d]), &nbytes) || nbytes > r.left())
      r.fail("tensor '" + name + "' claims shape " + shape_str(Shape(shape.begin(), shape.begin() + d + 1)) +
             (d + 1 < ndim ? "..." : "") + ", more than the " + std::to_string(r.left()) + " bytes left");
  }
  const char* data = r.take(nbytes, "tensor data");
  if (dtype == kBool)  // any other byte would be an invalid bool
    for (uint64_t i = 0; i < nbytes; ++i)
      if (static_cast<uint8_t>(data[i]) > 1) r.fail("bool tensor '" + name + "' holds byte value " + std::to_string(static_cast<uint8_t>(data[i])));
  return from_buffer(data, shape, dtype, Device::cpu());
}

// "checkpoint 'path': " or "checkpoint (in memory): ", for errors of the helpers.
std::string where(const Checkpoint& c) {
  return c.source.empty() ? "checkpoint (in memory): " : "checkpoint '" + c.source + "': ";
}

// Known names near a missing one: those that share its first dotted component (at most 10).
template <typename T>
std::string near_names(const std::map<std::string, T>& m, const std::string& name) {
  const std::string head = name.substr(0, name.find('.') + 1);
  std::string s;
  int shown = 0;
  for (const auto& [k, v] : m) {
    if (k.compare(0, head.size(), head) != 0) continue;
    if (shown++ == 10) return s + ", ...";
    s += (s.empty() ? "" : ", ") + k;
  }
  return s.empty() ? "none" : s;
}

template <typename T>
const T& lookup(const Checkpoint& c, const std::map<std::string, T>& m, const std::string& name, const char* kind) {
  auto it = m.find(name);
  BRAID_CHECK_T(IndexError, it != m.end(), where(c), "no ", kind, " '", name, "'; ", kind, "s starting with '",
                name.substr(0, name.find('.') + 1), "': ", near_names(m, name));
  return it->second;
}

// Entries of m whose name starts with prefix, with the prefix removed.
template <typename T>
std::map<std::string, T> with_prefix(const std::map<std::string, T>& m, const std::string& prefix) {
  std::map<std::string, T> out;
  for (auto it = m.lower_bound(prefix); it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.emplace(it->first.substr(prefix.size()), it->second);
  return out;
}

// Runs f, adding the checkpoint's file to the message of a braid error it throws (same type).
template <typename F>
void naming_source(const Checkpoint& c, F f) {
  try {
    f();
  } catch (const ValueError& e) {
    throw ValueError(where(c) + e.what());
  } catch (const IndexError& e) {
    throw IndexError(where(c) + e.what());
  } catch (const TypeError& e) {
    throw TypeError(where(c) + e.what());
  }
}

}  // namespace

const Tensor& Checkpoint::tensor(const std::string& name) const { return lookup(*this, tensors, name, "tensor"); }
double Checkpoint::scalar(const std::string& name) const { return lookup(*this, scalars, name, "scalar"); }
int64_t Checkpoint::integer(const std::string& name) const { return lookup(*this, integers, name, "integer"); }
const std::string& Checkpoint::string(const std::string& name) const { return lookup(*this, strings, name, "string"); }

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  // Argument errors first, so that inside the write only I/O can fail.
  for (const auto& [name, t] : ckpt.tensors) BRAID_CHECK(t.defined(), "save_checkpoint: tensor '", name, "' is undefined");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("save_checkpoint '" + path + "': cannot create '" + tmp + "': " + errno_str());
  try {
    // The payload first, after room for the header, which needs the payload's CRC and size.
    if (::lseek(fd, kHeaderSize, SEEK_SET) < 0) throw Error("seek '" + tmp + "': " + errno_str());
    Writer w(fd, tmp);
    write_payload(w, ckpt);
    w.flush();
    char header[kHeaderSize];
    const uint32_t version = kVersion, crc = w.crc();
    const uint64_t size = w.size();
    std::memcpy(header, kMagic, 8);
    std::memcpy(header + 8, &version, 4);
    std::memcpy(header + 12, &crc, 4);
    std::memcpy(header + 16, &size, 8);
    if (::pwrite(fd, header, kHeaderSize, 0) != static_cast<ssize_t>(kHeaderSize)) throw Error("write '" + tmp + "': " + errno_str());
    if (::fsync(fd) != 0) throw Error("fsync '" + tmp + "': " + errno_str());
  } catch (const Error& e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error("save_checkpoint '" + path + "': " + e.what());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const std::string err = errno_str();
    ::unlink(tmp.c_str());
    throw Error("save_checkpoint '" + path + "': close '" + tmp + "': " + err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_str();
    ::unlink(tmp.c_str());
    throw Error("save_checkpoint '" + path + "': rename '" + tmp + "' to it: " + err);
  }
  // Makes the rename itself durable. The checkpoint is complete and in place by now, so a failure
  // here (some file systems refuse fsync on a directory) is not worth an error.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

Checkpoint load_checkpoint(const std::string& path, Device map_location) {
  const auto fail = [&](const std::string& what) -> void { throw Error("load_checkpoint '" + path + "': " + what); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open: " + errno_str());
  std::string bytes;
  {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("not a regular file");
    }
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const std::string err = r < 0 ? errno_str() : "file shrank while reading";
        ::close(fd);
        fail("read: " + err);
      }
      got += static_cast<size_t>(r);
    }
    ::close(fd);
  }
  if (bytes.size() < kHeaderSize)
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " + std::to_string(kHeaderSize) + "-byte header");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) fail("not a braid checkpoint (bad magic number)");
  uint32_t version, crc;
  uint64_t size;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&crc, bytes.data() + 12, 4);
  std::memcpy(&size, bytes.data() + 16, 8);
  if (version != kVersion)
    fail("format version " + std::to_string(version) + ", but this build reads version " + std::to_string(kVersion));
  const uint64_t actual = bytes.size() - kHeaderSize;
  if (size != actual)
    fail(std::string(size > actual ? "truncated" : "trailing data") + ": the header gives a payload of " +
         std::to_string(size) + " bytes, the file holds " + std::to_string(actual));
  const uint32_t computed = crc32_of(0, bytes.data() + kHeaderSize, size);
  if (computed != crc)
    fail("checksum mismatch (stored " + std::to_string(crc) + ", computed " + std::to_string(computed) + "): the file is corrupt");

  Checkpoint c;
  c.source = path;
  Reader r(path, bytes.data() + kHeaderSize, size);
  read_section(r, c.tensors, "tensors", [&](const std::string& name) { return read_tensor(r, name); });
  read_section(r, c.scalars, "scalars", [&](const std::string&) { return r.number<double>("a scalar"); });
  read_section(r, c.integers, "integers", [&](const std::string&) { return r.number<int64_t>("an integer"); });
  read_section(r, c.strings, "strings", [&](const std::string&) {
    const uint64_t n = r.number<uint64_t>("a string's length");
    return std::string(r.take(n, "a string"), n);
  });
  if (r.left() != 0) r.fail("corrupt payload: " + std::to_string(r.left()) + " bytes after the last section");
  for (auto& [name, t] : c.tensors) t = t.to(map_location);
  return c;
}

void store_state(Checkpoint& ckpt, const std::string& prefix, const nn::Module& module) {
  NoGradGuard no_grad;
  for (const auto& [name, t] : module.state_dict()) ckpt.tensors[prefix + name] = t.detach().clone();
}

void restore_state(const Checkpoint& ckpt, const std::string& prefix, nn::Module& module) {
  const nn::StateDict theirs = with_prefix(ckpt.tensors, prefix), mine = module.state_dict();
  // Every check before any write, in name order, so the error names the first mismatching tensor.
  for (const auto& [name, t] : mine) {
    auto it = theirs.find(name);
    BRAID_CHECK(it != theirs.end(), where(ckpt), "no tensor '", prefix, name, "' for the model's ", name,
                " (", module.type_name(), "); the checkpoint's tensors under '", prefix, "': ", near_names(theirs, ""));
    BRAID_CHECK(it->second.shape() == t.shape() && it->second.dtype() == t.dtype(), where(ckpt), "tensor '", prefix,
                name, "' is ", dtype_name(it->second.dtype()), " ", shape_str(it->second.shape()), " but the model's '",
                name, "' is ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
  }
  for (const auto& [name, t] : theirs)
    BRAID_CHECK(mine.count(name), where(ckpt), "unexpected tensor '", prefix, name, "': the model (", module.type_name(),
                ") has no parameter or buffer '", name, "'");
  naming_source(ckpt, [&] { module.load_state_dict(theirs, true); });
}

void store_state(Checkpoint& ckpt, const std::string& prefix, const optim::Optimizer& optimizer) {
  const optim::OptimizerState st = optimizer.state_dict();
  for (const auto& [name, t] : st.tensors) ckpt.tensors[prefix + name] = t;
  for (const auto& [name, v] : st.scalars) ckpt.scalars[prefix + name] = v;
}

void restore_state(const Checkpoint& ckpt, const std::string& prefix, optim::Optimizer& optimizer) {
  const optim::OptimizerState st{with_prefix(ckpt.tensors, prefix), with_prefix(ckpt.scalars, prefix)};
  naming_source(ckpt, [&] { optimizer.load_state_dict(st); });
}

void store_state(Checkpoint& ckpt, const std::string& prefix, const optim::LRScheduler& scheduler) {
  for (const auto& [name, v] : scheduler.state_dict()) ckpt.scalars[prefix + name] = v;
}

void restore_state(const Checkpoint& ckpt, const std::string& prefix, optim::LRScheduler& scheduler) {
  naming_source(ckpt, [&] { scheduler.load_state_dict(with_prefix(ckpt.scalars, prefix)); });
}

void store_state(Checkpoint& ckpt, const std::string& prefix, const optim::GradScaler& scaler) {
  for (const auto& [name, v] : scaler.state_dict()) ckpt.scalars[prefix + name] = v;
}

void restore_state(const Checkpoint& ckpt, const std::string& prefix, optim::GradScaler& scaler) {
  naming_source(ckpt, [&] { scaler.load_state_dict(with_prefix(ckpt.scalars, prefix)); });
}

void store_state(Checkpoint& ckpt, const std::string& prefix, const Generator& generator) {
  // Two's complement keeps every 64-bit value (C++20 defines the conversion both ways).
  ckpt.integers[prefix + "seed"] = static_cast<int64_t>(generator.seed());
  ckpt.integers[prefix + "offset"] = static_cast<int64_t>(generator.offset());
}

void restore_state(const Checkpoint& ckpt, const std::string& prefix, Generator& generator) {
  const int64_t seed = ckpt.integer(prefix + "seed"), offset = ckpt.integer(prefix + "offset");
  generator.set_state(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset));
}

void store_state(Checkpoint& ckpt, const std::string& prefix, const data::DataLoader& loader) {
  ckpt.integers[prefix + "epoch"] = loader.epoch();
  ckpt.integers[prefix + "batch"] = loader.batch();
}

void restore_state(const Checkpoint& ckpt, const std::string& prefix, data::DataLoader& loader) {
  const int64_t epoch = ckpt.integer(prefix + "epoch"), batch = ckpt.integer(prefix + "batch");
  naming_source(ckpt, [&] { loader.seek(epoch, batch); });
}

}  // namespace braid
