// Numeric CSV: comma-separated numbers, one row per line, into a float32 matrix. Values are parsed
// as double and rounded once to float, as numpy.loadtxt(dtype=float32) does.
#include <charconv>
#include <vector>

#include "braid/data/readers.h"
#include "braid/ops.h"
#include "data/input_file.h"

namespace braid::data {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

Tensor read_csv(const std::string& path, bool has_header) {
  detail::InputFile in(path);
  const std::string text = in.read_all();
  std::vector<float> values;
  int64_t cols = -1, rows = 0, cols_line = 0;
  size_t pos = 0;
  for (int64_t line = 1; pos < text.size(); ++line) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view row = trim(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    if ((has_header && line == 1) || row.empty()) continue;
    int64_t col = 0;
    for (size_t start = 0;; ++col) {
      size_t comma = row.find(',', start);
      const std::string_view field = trim(row.substr(start, comma == std::string_view::npos ? row.npos : comma - start));
      double v = 0;
      const char* first = field.data();
      if (!field.empty() && field.front() == '+') ++first;  // from_chars takes no '+'
      const auto [ptr, ec] = std::from_chars(first, field.data() + field.size(), v);
      if (field.empty() || ec != std::errc() || ptr != field.data() + field.size())
        detail::file_error(path, "line " + std::to_string(line) + ", column " + std::to_string(col + 1) + ": '" +
                                     std::string(field) + "' is not a number");
      values.push_back(static_cast<float>(v));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    ++col;
    if (cols < 0) {
      cols = col;
      cols_line = line;
    } else if (col != cols) {
      detail::file_error(path, "line " + std::to_string(line) + " has " + std::to_string(col) + " columns, but line " +
                                   std::to_string(cols_line) + " has " + std::to_string(cols));
    }
    ++rows;
  }
  if (rows == 0) detail::file_error(path, "no data rows");
  return from_buffer(values.data(), {rows, cols}, kFloat32);
}

}  // namespace braid::data
