// InputFile over zlib's gz* functions, which read plain files transparently, so every reader
// accepts gzipped and uncompressed files alike.
#include "data/input_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "braid/error.h"

namespace braid::data::detail {

void file_error(const std::string& path, const std::string& message) { throw Error("'" + path + "': " + message); }

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) file_error(path_, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) file_error(path_, "not a regular file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  file_ = gzopen(path_.c_str(), "rb");
  if (file_ == nullptr) file_error(path_, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(file_, 1 << 17);
}

InputFile::~InputFile() {
  if (file_ != nullptr) gzclose(file_);
}

uint64_t InputFile::max_bytes() const {
  const uint64_t total = gzdirect(file_) ? file_size_ : file_size_ * 1032;
  return total - std::min(total, pos_);
}

uint64_t InputFile::read_some(void* dst, uint64_t n) {
  uint64_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(n - done, 1u << 30));
    const int got = gzread(file_, static_cast<char*>(dst) + done, chunk);
    int code = Z_OK;
    const char* msg = gzerror(file_, &code);
    // Z_BUF_ERROR is a gzip stream cut short: the bytes so far are good, the caller reports truncation.
    if (got < 0 || (code != Z_OK && code != Z_BUF_ERROR))
      file_error(path_, std::string("corrupt compressed data (zlib: ") + msg + ")");
    done += static_cast<uint64_t>(std::max(got, 0));
    if (got < static_cast<int>(chunk)) break;
  }
  pos_ += done;
  return done;
}

void InputFile::read_exact(void* dst, uint64_t n, const std::string& what) {
  const uint64_t got = read_some(dst, n);
  if (got < n)
    file_error(path_, "truncated: expected " + std::to_string(n) + " bytes of " + what + " at byte " +
                          std::to_string(pos_ - got) + ", but the data ends after " + std::to_string(got));
}

std::string InputFile::read_all() {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const uint64_t got = read_some(buf, sizeof buf);
    out.append(buf, got);
    if (got < sizeof buf) return out;
  }
}

void InputFile::expect_end(const std::string& what) {
  char c;
  if (read_some(&c, 1) != 0) file_error(path_, "unexpected data after " + what + " (at byte " + std::to_string(pos_ - 1) + ")");
}

}  // namespace braid::data::detail
