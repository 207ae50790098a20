// The thread's active op trace (see trace.h).
#include "ops/trace.h"

namespace braid::detail {

namespace {
thread_local Trace* t_trace = nullptr;
}

Trace* active_trace() { return t_trace; }

TraceScope::TraceScope(Trace* trace) : prev_(t_trace) { t_trace = trace; }
TraceScope::~TraceScope() { t_trace = prev_; }

void trace_append(const char* op, const Tensor& out, std::vector<Tensor> inputs, TraceAttrs attrs) {
  t_trace->entries.push_back(TraceEntry{op, std::move(inputs), out, std::move(attrs)});
}

}  // namespace braid::detail
