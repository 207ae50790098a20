// The shared oneDNN plumbing's out-of-line half (dnnl_common.h): the engine, scratch memory, the
// reorder of a kept weight, and the switch that every path into oneDNN asks first (Note [oneDNN's
// team size]).
#include "braid/config.h"

#ifdef BRAID_HAVE_DNNL
#include "backend/cpu/dnnl_common.h"

#include <omp.h>

#include <array>
#include <cstring>
#include <optional>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "braid/parallel.h"
#include "core/knob_read.h"

namespace braid::detail {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

Scratch::Scratch(size_t bytes) : bytes_(static_cast<int64_t>((bytes + 63) / 64 * 64)) {
  if (bytes_ > 0) p_ = cpu_backend().allocate(Device::cpu(), bytes_);
}

Scratch::~Scratch() {
  if (p_) cpu_backend().deallocate(Device::cpu(), p_, bytes_);
}

void reorder_now(const dnnl::memory::desc& from_desc, const void* from, const dnnl::memory::desc& to_desc, void* to,
                 dnnl::stream& stream) {
  dnnl::memory user(from_desc, engine(), const_cast<void*>(from));
  dnnl::memory inner(to_desc, engine(), to);
  dnnl::reorder(user, inner).execute(stream, user, inner);
  stream.wait();
}

void append_epilogue(dnnl::post_ops& ops, Epilogue::Kind kind, float a, float b, float scale, float shift) {
  using A = dnnl::algorithm;
  switch (kind) {
    case Epilogue::Kind::None:
      break;
    case Epilogue::Kind::Relu:
      ops.append_eltwise(1.f, A::eltwise_relu, 0.f, 0.f);
      break;
    case Epilogue::Kind::Clip:
      ops.append_eltwise(1.f, A::eltwise_clip, a, b);
      break;
    case Epilogue::Kind::HardSwish:
      ops.append_eltwise(1.f, A::eltwise_hardswish, 0.f, 0.f);
      break;
    case Epilogue::Kind::HardSigmoid:
      ops.append_eltwise(1.f, A::eltwise_linear, a, b);
      ops.append_eltwise(1.f, A::eltwise_clip, 0.f, 1.f);
      break;
  }
  if (scale != 1.f || shift != 0.f) ops.append_eltwise(1.f, A::eltwise_linear, scale, shift);
}

// Note [Reordered weights kept]
// A forward convolution's weight in the kernel's blocked layout is kept with the weight's storage
// (Storage::set_derived) and used again while the storage's version stands (Note [Storage
// versions]): in inference the weights do not change between runs, and reordering them on every
// run was a pass over all of a model's weights each time (measured: benchmarks/README.md, What
// changed what, ONNX inference, run I). A training step changes the weights (the
// optimizer's in-place update bumps the version), so there each forward reorders afresh, as before.
// The backward passes reorder as they always did.
std::shared_ptr<KeptLayout> kept_layout(const char* name, const dnnl::memory::desc& plain,
                                        const dnnl::memory::desc& chosen, const Tensor& w, dnnl::stream& stream) {
  const std::string key = std::string("onednn-") + name + "-weight@" + std::to_string(w.offset());
  if (auto kept = std::static_pointer_cast<KeptLayout>(w.storage()->derived(key)); kept && kept->desc == chosen)
    return kept;
  const uint64_t version = w.storage()->version();
  auto made = std::make_shared<KeptLayout>(chosen);
  reorder_now(plain, w.raw_data(), chosen, made->data.get(), stream);
  if (w.storage()->version() == version) w.storage()->set_derived(key, made);
  return made;
}

namespace {

// A set of the plan's memory objects, made with no buffers (Note [Memory objects kept with the plan]).
std::unique_ptr<ReorderedPrimitive::Bound> make_bound(const ReorderedPrimitive& p) {
  auto b = std::make_unique<ReorderedPrimitive::Bound>();
  for (int i = 0; i < 3; ++i) {
    b->user[i] = unbound(p.plain[i], engine());
    b->inner[i] = unbound(p.chosen[i], engine());
  }
  b->bias = unbound(
      dnnl::memory::desc({p.plain[2].dims()[1]}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::x), engine());
  if (p.scratchpad) b->pad = unbound(*p.scratchpad, engine());
  b->residual = unbound(p.plain[2], engine());
  return b;
}

}  // namespace

void ReorderedPrimitive::make_reorders(bool residual) {
  for (int i = 0; i < 3; ++i)
    if (chosen[i] != plain[i])
      reorders[i] = dnnl::reorder(i < 2 ? dnnl::reorder::primitive_desc(engine(), plain[i], engine(), chosen[i])
                                        : dnnl::reorder::primitive_desc(engine(), chosen[i], engine(), plain[i]));
  if (residual && chosen[2] != plain[2])
    residual_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), plain[2], engine(), chosen[2]));
}

void run_reordered(const ReorderedPrimitive& p, const char* what, const void* in0, const void* in1, const void* bias,
                   void* out, const Tensor* weight, const void* residual) {
  thread_local dnnl::stream stream(engine());
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  Lease<ReorderedPrimitive::Bound> lease(*p.pool, [&p] { return make_bound(p); });
  ReorderedPrimitive::Bound& b = *lease;
  std::array<dnnl_exec_arg_t, 5> args{};
  int n = 0;
  std::optional<Scratch> scratch[3];
  std::shared_ptr<KeptLayout> kept;
  const void* ptrs[3] = {in0, in1, out};
  // Note [Residual as a post-op]: the output buffer starts as the residual.
  if (residual && residual != out && !p.residual_in) std::memcpy(out, residual, p.plain[2].get_size());
  for (int i = 0; i < 3; ++i) {
    if (!p.reorders[i]) {  // the kernel reads or writes braid's layout
      args[n++] = {p.args[i], point(b.user[i], ptrs[i])};
      continue;
    }
    if (i == 1 && weight != nullptr) {
      kept = kept_layout(what, p.plain[1], p.chosen[1], *weight, stream);
      args[n++] = {p.args[1], point(b.inner[1], kept->data.get())};
      continue;
    }
    scratch[i].emplace(p.chosen[i].get_size());
    const dnnl_exec_arg_t move[2] = {{DNNL_ARG_FROM, point(b.user[i], ptrs[i])},
                                     {DNNL_ARG_TO, point(b.inner[i], scratch[i]->get())}};
    if (i < 2) run_primitive(*p.reorders[i], stream, move, 2, what);
    if (i == 2 && residual && p.residual_in) {
      const dnnl_exec_arg_t in[2] = {{DNNL_ARG_FROM, point(b.residual, residual)}, move[1]};
      run_primitive(*p.residual_in, stream, in, 2, what);
    }
    args[n++] = {p.args[i], b.inner[i].get()};
  }
  if (bias) args[n++] = {DNNL_ARG_BIAS, point(b.bias, bias)};
  std::optional<Scratch> pad;
  if (p.scratchpad) {
    pad.emplace(p.scratchpad->get_size());
    args[n++] = {DNNL_ARG_SCRATCHPAD, point(b.pad, pad->get())};
  }
  run_primitive(p.prim, stream, args.data(), n, what);
  if (scratch[2]) {
    const dnnl_exec_arg_t back[2] = {{DNNL_ARG_FROM, b.inner[2].get()}, {DNNL_ARG_TO, b.user[2].get()}};
    run_primitive(*p.reorders[2], stream, back, 2, what);
  }
  stream.wait();
}

// Note [oneDNN's team size]
// oneDNN sizes its parallel regions by omp_get_max_threads() on the calling thread, read when a
// primitive is made (a brgemm kernel plans its blocks for that many threads, and keeps the count)
// and when it runs. That count is per thread: braid applies BRAID_NUM_THREADS (or set_num_threads)
// on the thread that first asks for it, so a program whose first braid work is a oneDNN product
// (Python loading an ONNX model made of MatMuls), or any other thread (a data loader, a Python
// thread), gave oneDNN every core whatever braid was told. Every path into oneDNN asks
// onednn_enabled() first, which sets the calling thread's count to braid's (two loads when they
// agree already).
bool onednn_enabled() {
  static const bool on = detail::knob_flag("BRAID_ONEDNN");
  if (on && !omp_in_parallel()) {
    const int n = get_num_threads();
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
  }
  return on;
}

}  // namespace braid::detail

#endif  // BRAID_HAVE_DNNL
