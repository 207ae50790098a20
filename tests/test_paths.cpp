// Note [Test paths] in test_paths.h: the one file compiled with the paths of this clone.
#include "test_paths.h"

namespace braid::test {

const char* source_dir() { return BRAID_TEST_SOURCE; }
const char* data_dir() { return BRAID_TEST_SOURCE "/data"; }
const char* diff_cases_path() { return BRAID_DIFF_CASES; }

}  // namespace braid::test
