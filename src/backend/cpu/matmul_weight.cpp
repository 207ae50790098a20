// float32 products by a matrix shared by every row (a weight) through oneDNN's matmul primitive
// (Note [Products by a weight through oneDNN's matmul]).
#include "braid/config.h"

#ifdef BRAID_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dnnl_common.h"

namespace braid::detail {

namespace {

// Note [Products by a weight through oneDNN's matmul]
// dnnl_sgemm packs B into its kernel's layout on every call. For a product whose B is shared by
// every row (an nn::Linear's or an ONNX MatMul's weight against a batch of activations) braid runs
// oneDNN's matmul primitive instead, one per shape, which reads B either as it lies or in the
// blocked layout the primitive chose: B is reordered into that layout once and kept with its
// storage (Storage::set_derived) from its second product at the same version in the same
// orientation on, as the convolutions keep theirs (Note [Reordered weights kept]). The first
// product of a storage at a version marks it and reads B as it lies, so that a matrix made afresh
// for each product is never reordered for nothing, and a training step, whose optimizer moves each
// weight's version, never reorders. Both kinds of call run the same brgemm kernel, which copies a
// plain B into the same blocks itself, so a product's bits do not depend on whether its weight was
// seen before: a plan is built only where oneDNN picks the same implementation for the two
// layouts, and tests/test_tensor.cpp checks the two agree bit for bit. Kept, B is faster than
// dnnl_sgemm's packing on every product of MiniLM; read as it lies it is slower on some training
// shapes, which moved the training steps within the run-to-run spread (measured: benchmarks/README.md,
// What changed what, run X). A shape the primitive does not take stays with dnnl_sgemm, always.
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// The primitive of a shape on B in its own blocked layout (kept) and on B as it lies (plain).
struct Plan {
  dnnl::matmul::primitive_desc kept_pd;
  dnnl::matmul kept, plain;
  dnnl::memory::desc b_plain;
  // Memory objects pointed at each call's buffers (as in Note [Memory objects kept with the
  // plan], dnnl_common.h): per call, a free set is taken and given back.
  struct Bound {
    dnnl::memory a, b_kept, b_plain, c;
  };
  std::unique_ptr<SetPool<Bound>> pool = std::make_unique<SetPool<Bound>>();
};

using Key = std::array<int64_t, 6>;  // m, k, n, lda, ldb, B transposed

// The plan of a shape: A (M, K) with row stride lda by B (K, N; row stride ldb, or its transpose
// when tb) into C (M, N) row-major; null where oneDNN has none or picks different kernels for the
// two layouts of B.
std::shared_ptr<const Plan> plan_for(const Key& key) {
  static PlanCache<Key, Plan> cache;
  return cache.get(key, [&key]() -> std::shared_ptr<const Plan> {
    const auto [m, k, n, lda, ldb, tb] = key;
    const dnnl::memory::desc a({m, k}, dt::f32, dnnl::memory::dims{lda, 1}), c({m, n}, dt::f32, tag::ab);
    const dnnl::memory::desc b_plain({k, n}, dt::f32, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
    const dnnl::memory::desc b_any({k, n}, dt::f32, tag::any);
    const dnnl::matmul::primitive_desc kept_pd(dnnl::matmul::desc(a, b_any, c), engine());
    const dnnl::matmul::primitive_desc plain_pd(dnnl::matmul::desc(a, b_plain, c), engine());
    if (std::string(kept_pd.impl_info_str()) != plain_pd.impl_info_str() ||
        std::string(kept_pd.impl_info_str()).rfind("brg", 0) != 0)
      return nullptr;  // dnnl_sgemm serves it, as it does a shape with no kernel
    auto p = std::make_shared<Plan>();
    p->kept_pd = kept_pd;
    p->kept = dnnl::matmul(kept_pd);
    p->plain = dnnl::matmul(plain_pd);
    p->b_plain = b_plain;
    return p;
  });
}

struct KeptWeight {
  dnnl::memory::desc desc;
  std::vector<float> data;
};

// B in the layout `desc` (a kept primitive's), from the second product of b's storage at its
// version in this orientation on; null the first time, which marks the storage where `mark`.
std::shared_ptr<KeptWeight> kept_weight(const Tensor& b, bool tb, const dnnl::memory::desc& desc,
                                        const dnnl::memory::desc& b_plain, dnnl::stream& stream, bool mark = true) {
  const std::shared_ptr<Storage>& st = b.storage();
  const std::string key = "onednn-f32-weight@" + std::to_string(b.offset()) + (tb ? "t" : "n");
  if (auto kept = std::static_pointer_cast<KeptWeight>(st->derived(key)); kept && kept->desc == desc) return kept;
  const std::string seen = key + "-seen";
  if (!st->derived(seen)) {
    if (mark) st->set_derived(seen, std::make_shared<int>(1));
    return nullptr;
  }
  const uint64_t version = st->version();
  auto made = std::make_shared<KeptWeight>();
  made->desc = desc;
  made->data.resize(made->desc.get_size() / sizeof(float));
  reorder_now(b_plain, b.raw_data(), made->desc, made->data.data(), stream);
  if (st->version() == version) st->set_derived(key, made);
  return made;
}

std::unique_ptr<Plan::Bound> make_bound(const Plan& p) {
  auto b = std::make_unique<Plan::Bound>();
  b->a = unbound(p.kept_pd.src_desc(), engine());
  b->b_kept = unbound(p.kept_pd.weights_desc(), engine());
  b->b_plain = unbound(p.b_plain, engine());
  b->c = unbound(p.kept_pd.dst_desc(), engine());
  return b;
}

// Note [float32 epilogues]
// A float32 product by a weight followed by arithmetic on it (a linear layer's bias, a
// transformer's residual, a scale) writes the product, then reads it back once per step. As for
// int8 (Note [int8 epilogues]) the leading steps by a number, a row of one value per column or a
// whole (M, N) operand go to the matmul primitive as binary post-ops, applied to each tile of sums
// in registers before it is stored: one float32 operation per step, in order, so the bits are
// the ops' where the primitive sums the product as the one without post-ops does
// (tests/test_matmul_chain.cpp compares the two). Only on a kept weight: the first product of a
// weight takes the ops, and marks it. MiniLM's 18 bias Adds and 6 residual Adds run so (measured:
// benchmarks/README.md, What changed what, run Z).
struct EpiloguePlan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory::desc b_plain;
  std::vector<dnnl::memory::desc> operands;  // the post-ops' second operands
  struct Bound {
    dnnl::memory a, b, c;
    std::vector<dnnl::memory> operands;
    std::vector<float> constants;  // the one-value operands given as numbers
  };
  std::unique_ptr<SetPool<Bound>> pool = std::make_unique<SetPool<Bound>>();
};

// m, k, n, then per post-op its algorithm and its operand's rows and columns.
std::shared_ptr<const EpiloguePlan> epilogue_plan_for(const std::vector<int64_t>& key) {
  static PlanCache<std::vector<int64_t>, EpiloguePlan> cache;
  return cache.get(key, [&key]() -> std::shared_ptr<const EpiloguePlan> {  // null: the steps run as ops
    const int64_t m = key[0], k = key[1], n = key[2];
    auto p = std::make_shared<EpiloguePlan>();
    dnnl::post_ops ops;
    for (size_t i = 3; i + 2 < key.size(); i += 3) {
      p->operands.emplace_back(dnnl::memory::dims{key[i + 1], key[i + 2]}, dt::f32, tag::ab);
      ops.append_binary(static_cast<dnnl::algorithm>(key[i]), p->operands.back());
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const dnnl::memory::desc a({m, k}, dt::f32, tag::ab), c({m, n}, dt::f32, tag::ab);
    const dnnl::memory::desc b_any({k, n}, dt::f32, tag::any);
    p->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b_any, c), attr, engine());
    if (std::string(p->pd.impl_info_str()).rfind("brg", 0) != 0) return nullptr;
    p->prim = dnnl::matmul(p->pd);
    p->b_plain = dnnl::memory::desc({k, n}, dt::f32, tag::ab);
    return p;
  });
}

}  // namespace

bool CpuBackend::matmul_epilogue(const Tensor& a, const Tensor& b, const std::vector<EpilogueStep>& epilogue,
                                 const Tensor& out) {
  if (!fused_on() || !onednn_enabled() || a.dtype() != kFloat32 || b.dtype() != kFloat32 || !b.is_contiguous())
    return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0 || epilogue.empty()) return false;
  std::vector<int64_t> key{m, k, n};
  for (const EpilogueStep& s : epilogue) {
    dnnl::algorithm alg;
    dnnl::memory::dims dims;
    if (!binary_post_op(s, m, n, alg, dims)) return false;
    key.insert(key.end(), {static_cast<int64_t>(alg), dims[0], dims[1]});
  }
  thread_local dnnl::stream stream(engine());
  const auto p = epilogue_plan_for(key);
  if (!p) return false;
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  const auto w = kept_weight(b, false, p->pd.weights_desc(), p->b_plain, stream, false);
  if (!w) return false;
  Lease<EpiloguePlan::Bound> lease(*p->pool, [&p] {
    auto bd = std::make_unique<EpiloguePlan::Bound>();
    bd->a = unbound(p->pd.src_desc(), engine());
    bd->b = unbound(p->pd.weights_desc(), engine());
    bd->c = unbound(p->pd.dst_desc(), engine());
    for (const auto& d : p->operands) bd->operands.push_back(unbound(d, engine()));
    bd->constants.resize(p->operands.size());
    return bd;
  });
  EpiloguePlan::Bound& bd = *lease;
  std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_SRC, point(bd.a, a.raw_data())},
                                    {DNNL_ARG_WEIGHTS, point(bd.b, w->data.data())},
                                    {DNNL_ARG_DST, point(bd.c, out.raw_data())}};
  for (size_t i = 0; i < epilogue.size(); ++i) {
    bd.constants[i] = epilogue[i].k;
    const void* operand = epilogue[i].operand.defined() ? epilogue[i].operand.raw_data() : &bd.constants[i];
    args.push_back(
        {DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i)) | DNNL_ARG_SRC_1, point(bd.operands[i], operand)});
  }
  run_primitive(p->prim, stream, args.data(), static_cast<int>(args.size()),
                "matmul (a product by a weight with its epilogue)");
  stream.wait();
  return true;
}

bool weight_sgemm(const Tensor& b, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t ldb,
                  float* c) {
  thread_local dnnl::stream stream(engine());
  const auto p = plan_for({m, k, n, lda, ldb, tb ? 1 : 0});
  if (!p) return false;
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  const auto w = kept_weight(b, tb, p->kept_pd.weights_desc(), p->b_plain, stream);
  Lease<Plan::Bound> lease(*p->pool, [&p] { return make_bound(*p); });
  Plan::Bound& bd = *lease;
  const dnnl_exec_arg_t args[3] = {
      {DNNL_ARG_SRC, point(bd.a, a)},
      {DNNL_ARG_WEIGHTS, w ? point(bd.b_kept, w->data.data()) : point(bd.b_plain, b.raw_data())},
      {DNNL_ARG_DST, point(bd.c, c)}};
  run_primitive(w ? p->kept : p->plain, stream, args, 3, "matmul (a product by a weight)");
  stream.wait();
  return true;
}

}  // namespace braid::detail

#endif
