// Where the tests find their files: the source tree's tests/ and tests/data, and the differential
// test's generated cases. Note [Test paths]: the paths are compiled into test_paths.cpp alone, so
// that the test files themselves carry no path of the clone and a fresh clone elsewhere finds them
// in the compiler cache (Note [Compiler cache] in scripts/run_tests.sh).
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace braid::test {

/// tests/ in the source tree.
const char* source_dir();
/// tests/data in the source tree (reference values made by the scripts beside them).
const char* data_dir();
/// The differential test's cases (tests/diff/gen_cases.py's output in the build tree).
const char* diff_cases_path();

/// The rows of tests/data/<file>, one a line, each split into its whitespace-separated words; blank
/// lines and '#' comments are passed over. Throws, naming the path, when the file cannot be read.
inline std::vector<std::vector<std::string>> data_rows(const std::string& file) {
  const std::string path = std::string(data_dir()) + "/" + file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<std::string>& row = rows.emplace_back();
    for (std::string word; fields >> word;) row.push_back(word);
  }
  return rows;
}

}  // namespace braid::test
