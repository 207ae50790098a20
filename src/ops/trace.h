// Op tracing for ONNX export (Note [Export by tracing] in onnx/trace_export.cpp): while a Trace is
// active on this thread, every op's front door appends what it ran (op name, all inputs, output,
// and the arguments that are not tensors) before returning. Off, the cost is one thread-local load.
#pragma once

#include <string>
#include <vector>

#include "braid/tensor.h"
#include "core/arg_view.h"

namespace braid::detail {

/// The non-tensor arguments of a traced op, as numbers (axes, sizes, flags, scalars).
struct TraceAttrs {
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

/// traced()'s non-tensor arguments, as views; copied into TraceAttrs only when a trace is active.
struct TraceArgs {
  ArgView<int64_t> ints;
  ArgView<double> floats;
};

struct TraceEntry {
  std::string op;
  std::vector<Tensor> inputs;  // every tensor operand, in the op's argument order
  Tensor output;
  TraceAttrs attrs;
};

/// The ops one forward pass ran, in order. Holding the tensors keeps their addresses unique.
struct Trace {
  std::vector<TraceEntry> entries;
};

Trace* active_trace();

/// Makes trace the active one for its scope (nested scopes restore the outer one).
class TraceScope {
 public:
  explicit TraceScope(Trace* trace);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* prev_;
};

void trace_append(const char* op, const Tensor& out, ArgView<Tensor> inputs, TraceArgs attrs);

/// Records op in the active trace, if any; returns out.
inline const Tensor& traced(const char* op, const Tensor& out, ArgView<Tensor> inputs, TraceArgs attrs = {}) {
  if (active_trace() != nullptr) trace_append(op, out, inputs, attrs);
  return out;
}

}  // namespace braid::detail
