// A GoogleTest main for programs that the suite runs under `mpiexec -n N` (and plainly, as a world
// of one). Every rank runs every test; rank 0 alone writes the XML that CI counts, so a test's
// TearDown (DistTest) folds a failure on any rank into rank 0's result.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "braid/distributed.h"
#include "braid/ops.h"

namespace braid::testing {

/// This rank and the number of ranks in the world: the tests' shorthand.
inline int R() { return distributed::world()->rank(); }
inline int N() { return distributed::world()->size(); }

/// Base fixture: a failure on any rank fails the test on every rank.
class DistTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Tensor failed = full({1}, HasFailure() ? 1.0 : 0.0, kInt32);
    distributed::world()->all_reduce(failed, distributed::ReduceOp::Max);
    if (failed.item() > 0 && !HasFailure()) ADD_FAILURE() << "another rank failed this test (see its output)";
  }
};

/// Prints only failures, prefixed with the rank (for ranks other than 0).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.message());
  }

 private:
  int rank_;
};

inline int mpi_test_main(int argc, char** argv) {
  const auto& info = distributed::init();
  distributed::set_timeout(120);  // a test that hangs fails with a message instead
  // Only rank 0 writes the XML report: the others drop --gtest_output before gtest opens it.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (info.rank == 0 || std::string(argv[i]).rfind("--gtest_output", 0) != 0) args.push_back(argv[i]);
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);  // argv[argc] is null, and gtest's flag parser moves it along
  ::testing::InitGoogleTest(&n, args.data());
  if (info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(info.rank));
  }
  const int rc = RUN_ALL_TESTS();
  distributed::finalize();
  return rc;
}

}  // namespace braid::testing
