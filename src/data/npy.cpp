// NumPy's .npy format: the magic "\x93NUMPY", a version, a little-endian header length, a Python
// dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces to a
// multiple of 64 bytes and ended by '\n', then the raw values.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "braid/data/readers.h"
#include "braid/ops.h"
#include "data/input_file.h"

namespace braid::data {

using detail::file_error;
using detail::InputFile;

namespace {

constexpr char kMagic[] = "\x93NUMPY";

struct NpyType {
  const char* descr;
  DType dtype;
  int64_t itemsize;  // in the file
};
// |u1 has no braid dtype: it is read as int32.
const NpyType kNpyTypes[] = {{"<f2", kFloat16, 2}, {"<f4", kFloat32, 4}, {"<f8", kFloat64, 8}, {"<i4", kInt32, 4},
                             {"<i8", kInt64, 8},   {"|u1", kInt32, 1},   {"|b1", kBool, 1}};

std::string known_descrs() {
  std::string s;
  for (const NpyType& t : kNpyTypes) s += (s.empty() ? "" : ", ") + std::string(t.descr);
  return s;
}

// The header dict, parsed as far as .npy needs: string, boolean and integer-tuple values.
class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), s_(text) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    bool seen[3] = {false, false, false};
    expect('{');
    while (skip_ws(), peek() != '}') {
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        skip_ws();
        if (peek() != '\'' && peek() != '"') fail("dtype descr " + rest() + " is not a simple dtype; supported: " + known_descrs());
        descr = string_literal();
        seen[0] = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        seen[1] = true;
      } else if (key == "shape") {
        shape = tuple();
        seen[2] = true;
      } else {
        fail("unknown key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') ++i_;
    }
    if (!seen[0] || !seen[1] || !seen[2]) fail("the header must have 'descr', 'fortran_order' and 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    file_error(path_, "malformed .npy header: " + what + " (header: " + s_ + ")");
  }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  std::string rest() const { return s_.substr(i_, 20); }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "' at " + rest());
    ++i_;
  }
  std::string string_literal() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a string at " + rest());
    const size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string v = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    skip_ws();
    if (s_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (s_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail("expected True or False at " + rest());
  }
  Shape tuple() {
    expect('(');
    Shape shape;
    while (skip_ws(), peek() != ')') {
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a size at " + rest());
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v)) fail("size too large");
        ++i_;
      }
      shape.push_back(v);
      skip_ws();
      if (peek() == ',') ++i_;
    }
    ++i_;
    return shape;
  }

  const std::string& path_;
  const std::string& s_;
  size_t i_ = 0;
};

// Python's repr of a tuple of ints: "()", "(3,)", "(2, 3)".
std::string tuple_repr(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

Tensor read_npy(const std::string& path) {
  InputFile in(path);
  char magic[8];
  in.read_exact(magic, 8, "the .npy magic number and version");
  if (std::memcmp(magic, kMagic, 6) != 0) file_error(path, "not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<uint8_t>(magic[6]);
  if (major < 1 || major > 3)
    file_error(path, ".npy format version " + std::to_string(major) + "." + std::to_string(static_cast<uint8_t>(magic[7])) +
                         " is not supported (1.0 to 3.0 are)");
  uint8_t len_bytes[4] = {0, 0, 0, 0};
  in.read_exact(len_bytes, major == 1 ? 2 : 4, "the header length");
  const uint64_t header_len = len_bytes[0] | (len_bytes[1] << 8) | (uint64_t{len_bytes[2]} << 16) | (uint64_t{len_bytes[3]} << 24);
  if (header_len > in.max_bytes())
    file_error(path, "truncated or corrupt: header length " + std::to_string(header_len) + " exceeds the file (" +
                         std::to_string(in.max_bytes()) + " bytes left)");
  std::string header(header_len, '\0');
  in.read_exact(header.data(), header_len, "the header");

  std::string descr;
  bool fortran = false;
  Shape shape;
  HeaderParser(path, header).parse(descr, fortran, shape);
  const NpyType* type = nullptr;
  for (const NpyType& t : kNpyTypes)
    if (descr == t.descr) type = &t;
  if (type == nullptr)
    throw TypeError("'" + path + "': .npy dtype '" + descr + "' is not supported; supported: " + known_descrs() +
                    " (little-endian)");
  if (fortran)
    throw NotImplementedError("'" + path + "': fortran_order arrays are not supported; save a C-ordered array "
                              "(numpy.ascontiguousarray) instead");
  // A zero-length axis anywhere makes the array empty, whatever the product of the axes before it.
  uint64_t nbytes = std::find(shape.begin(), shape.end(), 0) != shape.end() ? 0 : static_cast<uint64_t>(type->itemsize);
  for (int64_t s : shape)
    if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(s), &nbytes) || nbytes > in.max_bytes())
      file_error(path, "truncated or corrupt: shape " + shape_str(shape) + " of " + descr + " needs more bytes than the file holds (" +
                           std::to_string(in.max_bytes()) + " after the header)");

  Tensor out = empty(shape, type->dtype);
  if (type->itemsize == out.element_size()) {
    in.read_exact(out.raw_data(), nbytes, "array data");
  } else {  // |u1 -> int32
    std::vector<uint8_t> raw(nbytes);
    in.read_exact(raw.data(), nbytes, "array data");
    int32_t* o = out.data<int32_t>();
    for (uint64_t i = 0; i < nbytes; ++i) o[i] = raw[i];
  }
  if (type->dtype == kBool) {  // any other byte would be an invalid bool
    const auto* b = static_cast<const uint8_t*>(out.raw_data());
    for (uint64_t i = 0; i < nbytes; ++i)
      if (b[i] > 1) file_error(path, "bool element " + std::to_string(i) + " has byte value " + std::to_string(b[i]));
  }
  in.expect_end("the array data");
  return out;
}

void write_npy(const std::string& path, const Tensor& t) {
  const NpyType* type = nullptr;
  for (const NpyType& n : kNpyTypes)
    if (n.dtype == t.dtype() && n.itemsize == t.element_size()) type = &n;
  if (type == nullptr)
    throw TypeError("write_npy: " + dtype_name(t.dtype()) + " has no NumPy dtype (writing '" + path + "')");
  // numpy.lib.format: sorted keys, spare spaces for the first axis to grow to 21 digits, then
  // padding so that magic + length + header is a multiple of 64 bytes.
  std::string header = std::string("{'descr': '") + type->descr + "', 'fortran_order': False, 'shape': " +
                       tuple_repr(t.shape()) + ", }";
  if (t.dim() > 0) header += std::string(21 - std::to_string(t.shape()[0]).size(), ' ');
  const size_t pad = 64 - (10 + header.size() + 1) % 64;
  header += std::string(pad, ' ') + "\n";
  BRAID_CHECK(header.size() <= 65535, "write_npy: header of ", header.size(), " bytes is too long (writing '", path, "')");
  const Tensor data = t.detach().contiguous().cpu();  // written from any device

  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) file_error(path, std::string("cannot create: ") + std::strerror(errno));
  const uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(header.size() & 0xff),
                              static_cast<uint8_t>(header.size() >> 8)};
  const size_t nbytes = static_cast<size_t>(data.numel() * data.element_size());
  const bool ok = std::fwrite(prefix, 1, 10, f) == 10 && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
                  std::fwrite(data.raw_data(), 1, nbytes, f) == nbytes;
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) file_error(path, std::string("write failed: ") + std::strerror(ok ? errno : err));
}

}  // namespace braid::data
