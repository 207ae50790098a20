// int8 matrix products through oneDNN (Note [int8 GEMM through oneDNN]): its matmul primitive on a
// weight reordered once and kept (Note [Kept int8 weights]), or its GEMM routine.
#include "braid/config.h"

#ifdef BRAID_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dnnl_common.h"

namespace braid::detail {

namespace {

// Note [Kept int8 weights]
// dnnl_gemm_u8s8s32 packs B into its kernel's layout on every call: at the row counts of a
// transformer at batch 1 (32 tokens) that was a third of the product's time (measured:
// benchmarks/README.md, What changed what, ONNX inference, run R). A B that the same storage gives again at the same version (a quantised
// model's weight) goes instead to oneDNN's matmul primitive, B reordered into the layout it chose
// and kept with the storage (Storage::set_derived), as the convolutions keep theirs (Note
// [Reordered weights kept]). The first product of a storage marks it and takes the GEMM routine, so
// that activations, made afresh for every product, are never reordered for nothing. The primitive
// takes A's zero point at run time and B's as zero (a symmetric weight: onnxruntime's int8
// quantisers write those); the sums are the same exact int32 sums either way.
struct Primitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  std::vector<dnnl::memory::desc> operands;  // the post-ops' second operands
};

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// An epilogue step's oneDNN form: its binary algorithm and its operand's shape against (M, N).
struct PostOp {
  dnnl::algorithm alg;
  dnnl::memory::dims dims;  // {1, 1}, {1, N} or {M, N}
};

// The matmul primitive for (M, K) by (K, N): int32 out without post-ops; float32 out carried through
// them otherwise (Note [int8 epilogues]). Null where oneDNN has no kernel.
std::shared_ptr<const Primitive> primitive_for(int64_t m, int64_t k, int64_t n, const std::vector<PostOp>& post) {
  static PlanCache<std::vector<int64_t>, Primitive> cache;
  std::vector<int64_t> key{m, k, n};
  for (const PostOp& p : post) key.insert(key.end(), {static_cast<int64_t>(p.alg), p.dims[0], p.dims[1]});
  return cache.get(key, [&]() -> std::shared_ptr<const Primitive> {  // null: the GEMM routine serves it
    dnnl::primitive_attr attr;
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    if (!post.empty()) {
      dnnl::post_ops ops;
      for (const PostOp& q : post) ops.append_binary(q.alg, dnnl::memory::desc(q.dims, dt::f32, tag::ab));
      attr.set_post_ops(ops);
    }
    const dnnl::memory::desc a({m, k}, dt::u8, tag::ab), b({k, n}, dt::s8, tag::any),
        c({m, n}, post.empty() ? dt::s32 : dt::f32, tag::ab);
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
    std::vector<dnnl::memory::desc> operands;
    for (const PostOp& q : post) operands.emplace_back(q.dims, dt::f32, tag::ab);
    return std::make_shared<const Primitive>(Primitive{pd, dnnl::matmul(pd), std::move(operands)});
  });
}

struct KeptWeight {
  dnnl::memory::desc desc;
  std::vector<int8_t> data;
};

constexpr const char* kSeen = "onednn-int8-weight-seen";

// B (K, N) int8 in the primitive's layout: kept with B's storage from the second product on; null
// the first time (and when B is not a weight).
std::shared_ptr<KeptWeight> kept_weight(const Tensor& b, const Primitive& p, dnnl::stream& stream) {
  const std::shared_ptr<Storage>& st = b.storage();
  const std::string key = "onednn-int8-weight@" + std::to_string(b.offset());
  if (auto kept = std::static_pointer_cast<KeptWeight>(st->derived(key)); kept && kept->desc == p.pd.weights_desc())
    return kept;
  if (!st->derived(kSeen)) {
    st->set_derived(kSeen, std::make_shared<int>(1));
    return nullptr;
  }
  const uint64_t version = st->version();
  auto made = std::make_shared<KeptWeight>();
  made->desc = p.pd.weights_desc();
  made->data.resize(made->desc.get_size());
  reorder_now({{b.size(0), b.size(1)}, dt::s8, tag::ab}, b.raw_data(), made->desc, made->data.data(), stream);
  if (st->version() == version) st->set_derived(key, made);
  return made;
}

// A as uint8 with its zero point: itself, or an int8 A shifted by 128 into `shifted`.
const uint8_t* as_uint8(const Tensor& a, int64_t& a_zero, std::vector<uint8_t>& shifted) {
  if (a.dtype() == kUInt8) return a.data<uint8_t>();
  const int8_t* src = a.data<int8_t>();
  const int64_t count = a.numel();
  shifted.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) shifted[static_cast<size_t>(i)] = static_cast<uint8_t>(src[i] + 128);
  a_zero += 128;
  return shifted.data();
}

// A primitive's arguments, made once per thread and pointed at each call's memory (a dnnl::memory
// costs more to make than a small product's epilogue takes).
struct Bound {
  std::shared_ptr<const Primitive> primitive;  // kept alive while its arguments are
  std::unordered_map<int, dnnl::memory> args;
  int32_t zero = 0;
  std::vector<float> constants;  // the one-value operands given as numbers
};

// Runs p on A (M, K) uint8 and the kept B into out's memory, with the post-ops' operands (a
// pointer each, or null for the number in `constants`).
void execute(const std::shared_ptr<const Primitive>& p, const KeptWeight& w, const uint8_t* pa, int64_t a_zero,
             void* out, const std::vector<const void*>& operands, const std::vector<float>& constants,
             dnnl::stream& stream) {
  thread_local std::unordered_map<const Primitive*, Bound> bound;
  if (bound.size() > 256) bound.clear();
  Bound& b = bound[p.get()];
  if (!b.primitive) {
    b.primitive = p;
    b.args = {{DNNL_ARG_SRC, dnnl::memory(p->pd.src_desc(), engine(), const_cast<uint8_t*>(pa))},
              {DNNL_ARG_WEIGHTS, dnnl::memory(p->pd.weights_desc(), engine(), const_cast<int8_t*>(w.data.data()))},
              {DNNL_ARG_DST, dnnl::memory(p->pd.dst_desc(), engine(), out)},
              {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, dnnl::memory({{1}, dt::s32, tag::x}, engine(), &b.zero)}};
    b.constants.resize(operands.size());
    for (size_t i = 0; i < operands.size(); ++i)
      b.args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i)) | DNNL_ARG_SRC_1,
                     dnnl::memory(p->operands[i], engine(), &b.constants[i]));
  }
  b.zero = static_cast<int32_t>(a_zero);
  b.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<uint8_t*>(pa));
  b.args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<int8_t*>(w.data.data()));
  b.args.at(DNNL_ARG_DST).set_data_handle(out);
  for (size_t i = 0; i < operands.size(); ++i) {
    b.constants[i] = constants[i];
    b.args.at(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i)) | DNNL_ARG_SRC_1)
        .set_data_handle(const_cast<void*>(operands[i] != nullptr ? operands[i] : &b.constants[i]));
  }
  thread_local std::vector<dnnl_exec_arg_t> args;
  args.clear();
  for (const auto& [id, m] : b.args) args.push_back({id, m.get()});
  run_primitive(p->prim, stream, args.data(), static_cast<int>(args.size()), "int8 matmul");
  stream.wait();
}

bool has_vnni() {
  static const bool vnni = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    return (isa & 0x40u) != 0 || (isa & 0x400u) != 0;  // avx512_core_vnni's or avx2_vnni's bit
  }();
  return vnni;
}

}  // namespace

// Note [int8 GEMM through oneDNN]
// oneDNN's dnnl_gemm_u8s8s32 computes (A - ao)(B - bo) in int32 for uint8 A and int8 B with one
// offset each. The other signedness maps onto it exactly: an int8 A is A + 128 as uint8 with
// offset ao + 128, a uint8 B is B - 128 as int8 with offset bo - 128 (a copy of the operand, O(MK)
// against the GEMM's O(MNK)). Without VNNI instructions oneDNN's int8 kernels add pairs of products
// in saturating 16-bit lanes, which can be off for large values, so those CPUs decline and
// int_matmul sums exactly in float64 instead.
bool CpuBackend::matmul_int8(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero, const Tensor& out) {
  if (!onednn_enabled() || !has_vnni()) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    std::fill_n(out.data<int32_t>(), m * n, 0);
    return true;
  }
  std::vector<uint8_t> a_shifted;
  const uint8_t* pa = as_uint8(a, a_zero, a_shifted);
  OneDnnSignalGuard no_signals;             // Note [Signals and oneDNN's kernels]
  if (b.dtype() == kInt8 && b_zero == 0) {  // Note [Kept int8 weights]
    thread_local dnnl::stream stream(engine());
    if (const auto p = primitive_for(m, k, n, {}))
      if (const auto w = kept_weight(b, *p, stream)) {
        execute(p, *w, pa, a_zero, out.data<int32_t>(), {}, {}, stream);
        return true;
      }
  }
  std::vector<int8_t> b_shifted;
  const int8_t* pb = nullptr;
  if (b.dtype() == kInt8) {
    pb = b.data<int8_t>();
  } else {
    const uint8_t* src = b.data<uint8_t>();
    b_shifted.resize(static_cast<size_t>(k * n));
    for (int64_t i = 0; i < k * n; ++i) b_shifted[static_cast<size_t>(i)] = static_cast<int8_t>(src[i] - 128);
    pb = b_shifted.data();
    b_zero -= 128;
  }
  const int32_t c_offset = 0;
  return dnnl_gemm_u8s8s32('N', 'N', 'F', m, n, k, 1.0f, pa, k, static_cast<uint8_t>(a_zero), pb, n,
                           static_cast<int8_t>(b_zero), 0.0f, out.data<int32_t>(), n, &c_offset) == dnnl_success;
}

// Note [int8 epilogues]
// onnxruntime's quantisers follow every MatMulInteger by a Cast to float32, a Mul by the two
// scales' product and an Add of the bias (and a transformer then adds the residual): passes over
// the product that onnxruntime itself runs inside its GEMM. matmul_int8_epilogue gives the steps to
// the matmul primitive as binary post-ops (operands of one value, one per column or one per
// element), which oneDNN applies to each tile of float32 sums in registers before it stores it: one
// conversion and one float32 operation per step, in order, so the bits are the ops'. Only on a
// kept weight (Note [Kept int8 weights]): the first product of a weight takes the ops.
bool CpuBackend::matmul_int8_epilogue(const Tensor& a, int64_t a_zero, const Tensor& b, int64_t b_zero,
                                      const std::vector<EpilogueStep>& epilogue, const Tensor& out) {
  if (!fused_on() || !onednn_enabled() || !has_vnni() || b.dtype() != kInt8 || b_zero != 0) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0) return false;
  std::vector<PostOp> post;
  std::vector<const void*> operands;
  std::vector<float> constants;
  for (const EpilogueStep& s : epilogue) {
    dnnl::algorithm alg;
    dnnl::memory::dims dims;
    if (!binary_post_op(s, m, n, alg, dims)) return false;
    post.push_back({alg, dims});
    operands.push_back(s.operand.defined() ? s.operand.raw_data() : nullptr);
    constants.push_back(s.k);
  }
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  thread_local dnnl::stream stream(engine());
  const auto p = primitive_for(m, k, n, post);
  if (!p) return false;
  const auto w = kept_weight(b, *p, stream);
  if (!w) return false;
  std::vector<uint8_t> a_shifted;
  const uint8_t* pa = as_uint8(a, a_zero, a_shifted);
  execute(p, *w, pa, a_zero, out.data<float>(), operands, constants, stream);
  return true;
}

}  // namespace braid::detail

#endif
