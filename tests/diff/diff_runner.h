// The differential test's runner: reads the JSON Lines cases that tests/diff/gen_cases.py writes
// (NumPy results under PyTorch's rules), runs each through braid by an explicit op table, and says
// how braid's result or error differs from the reference. The op table is a parameter, so the test
// of the test can plant a wrong op and check that the comparison catches it.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace braid::diff {

using Json = nlohmann::json;

/// One op of the table: the name braid's error messages use, and the call on the case's inputs.
struct DiffOp {
  std::string braid_name;
  std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const Json& args)> run;
};
using OpTable = std::map<std::string, DiffOp>;

struct DiffCase {
  int64_t id = 0;
  std::string op;
  Json json;  // the whole line: args, inputs, expect
};

/// Every public op of ops.h that the generator covers, by the generator's names.
OpTable builtin_ops();
/// The cases of a file (the header line is checked and skipped); throws std::runtime_error naming
/// the file and line when it cannot be read.
std::vector<DiffCase> load_cases(const std::string& path);
/// Runs one case: "" when braid agrees with the reference, else what differed (with the case's
/// id, op, args and input layouts, so the line can be rerun).
std::string run_case(const DiffCase& c, const OpTable& ops);

}  // namespace braid::diff
