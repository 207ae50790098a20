// The thread's active op trace (see trace.h).
#include "ops/trace.h"

namespace braid::detail {

namespace {
thread_local Trace* t_trace = nullptr;
}

Trace* active_trace() { return t_trace; }

TraceScope::TraceScope(Trace* trace) : prev_(t_trace) { t_trace = trace; }
TraceScope::~TraceScope() { t_trace = prev_; }

void trace_append(const char* op, const Tensor& out, ArgView<Tensor> inputs, TraceArgs attrs) {
  t_trace->entries.push_back(TraceEntry{op, inputs.vec(), out, TraceAttrs{attrs.ints.vec(), attrs.floats.vec()}});
}

}  // namespace braid::detail
