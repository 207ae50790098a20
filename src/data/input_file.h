// A read-only input that is either a plain file or a gzip stream (told apart by content, not by
// name), with reads that throw braid::Error naming the file on truncation or corruption, and an
// upper bound on the bytes it can still yield so that readers never trust a header's sizes blindly.
#pragma once

#include <cstdint>
#include <string>

#include <zlib.h>

namespace braid::data::detail {

class InputFile {
 public:
  /// Opens path; throws Error naming it when it is missing, not a regular file or unreadable.
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  /// An upper bound on the bytes left: the file size, or for gzip 1032 times it (deflate's largest
  /// expansion), so that a header's claim can be refused before anything is allocated for it.
  uint64_t max_bytes() const;
  /// Reads exactly n bytes of what (named in the error) or throws "truncated".
  void read_exact(void* dst, uint64_t n, const std::string& what);
  /// Reads up to n bytes; fewer only at the end of the data.
  uint64_t read_some(void* dst, uint64_t n);
  /// The rest of the data.
  std::string read_all();
  /// Throws Error unless the data ends here (a reader that has read everything it expects).
  void expect_end(const std::string& what);
  /// Bytes of (uncompressed) data read so far.
  uint64_t position() const { return pos_; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t pos_ = 0;
};

/// "<path>: <message>" as a braid::Error.
[[noreturn]] void file_error(const std::string& path, const std::string& message);

}  // namespace braid::data::detail
