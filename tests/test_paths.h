// Where the tests find their files: the source tree's tests/ and tests/data, and the differential
// test's generated cases. Note [Test paths]: the paths are compiled into test_paths.cpp alone, so
// that the test files themselves carry no path of the clone and a fresh clone elsewhere finds them
// in the compiler cache (Note [Compiler cache] in scripts/run_tests.sh).
#pragma once

namespace braid::test {

/// tests/ in the source tree.
const char* source_dir();
/// tests/data in the source tree (reference values made by the scripts beside them).
const char* data_dir();
/// The differential test's cases (tests/diff/gen_cases.py's output in the build tree).
const char* diff_cases_path();

}  // namespace braid::test
