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
#include "backend/cpu/dnnl_sets.h"

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
// layouts, and tests/test_tensor.cpp checks the two agree bit for bit. Measured with 2 threads on
// the AVX-512 VM against dnnl_sgemm: 32x384 by 384x1536 (MiniLM's feed-forward at 32 tokens) 198 ->
// 162 us kept, 256x384 by 384x1536 2017 -> 1059 us kept (1301 as it lies); MiniLM at batch 8
// 13.5 -> 12.0 ms a run. Read as it lies, B costs more on some shapes than dnnl_sgemm's packing
// (64x784 by 784x256, an MLP's first layer in training: 104 -> 136 us; 8x512 by 512x512 16 -> 33);
// the training steps of benchmarks/train_step.cpp moved within this VM's spread (mlp 1.11-1.31 ->
// 1.19-1.37 ms, transformer unchanged). A shape the primitive does not take stays with dnnl_sgemm,
// always.
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The primitive of a shape on B in its own blocked layout (kept) and on B as it lies (plain).
struct Plan {
  dnnl::matmul::primitive_desc kept_pd;
  dnnl::matmul kept, plain;
  dnnl::memory::desc b_plain;
  // Memory objects pointed at each call's buffers (as in Note [Memory objects kept with the
  // plan], conv_dnnl.cpp): per call, a free set is taken and given back.
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
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Plan>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto [m, k, n, lda, ldb, tb] = key;
  std::shared_ptr<const Plan> made;
  try {
    const dnnl::memory::desc a({m, k}, dt::f32, dnnl::memory::dims{lda, 1}), c({m, n}, dt::f32, tag::ab);
    const dnnl::memory::desc b_plain({k, n}, dt::f32, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
    const dnnl::memory::desc b_any({k, n}, dt::f32, tag::any);
    const dnnl::matmul::primitive_desc kept_pd(dnnl::matmul::desc(a, b_any, c), engine());
    const dnnl::matmul::primitive_desc plain_pd(dnnl::matmul::desc(a, b_plain, c), engine());
    if (std::string(kept_pd.impl_info_str()) == plain_pd.impl_info_str() &&
        std::string(kept_pd.impl_info_str()).rfind("brg", 0) == 0) {
      auto p = std::make_shared<Plan>();
      p->kept_pd = kept_pd;
      p->kept = dnnl::matmul(kept_pd);
      p->plain = dnnl::matmul(plain_pd);
      p->b_plain = b_plain;
      made = std::move(p);
    }
  } catch (const dnnl::error&) {  // no kernel: dnnl_sgemm serves it
  }
  if (cache.size() >= 1024) cache.clear();  // shapes that vary from call to call
  cache.emplace(key, made);
  return made;
}

struct KeptWeight {
  dnnl::memory::desc desc;
  std::vector<float> data;
};

// B in the kept primitive's layout, from the second product of b's storage at its version in this
// orientation on; null the first time.
std::shared_ptr<KeptWeight> kept_weight(const Tensor& b, bool tb, const Plan& p, dnnl::stream& stream) {
  const std::shared_ptr<Storage>& st = b.storage();
  const std::string key = "onednn-f32-weight@" + std::to_string(b.offset()) + (tb ? "t" : "n");
  if (auto kept = std::static_pointer_cast<KeptWeight>(st->derived(key));
      kept && kept->desc == p.kept_pd.weights_desc())
    return kept;
  const std::string seen = key + "-seen";
  if (!st->derived(seen)) {
    st->set_derived(seen, std::make_shared<int>(1));
    return nullptr;
  }
  const uint64_t version = st->version();
  auto made = std::make_shared<KeptWeight>();
  made->desc = p.kept_pd.weights_desc();
  made->data.resize(made->desc.get_size() / sizeof(float));
  dnnl::memory plain(p.b_plain, engine(), const_cast<void*>(b.raw_data()));
  dnnl::memory inner(made->desc, engine(), made->data.data());
  dnnl::reorder(plain, inner).execute(stream, plain, inner);
  stream.wait();
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

}  // namespace

bool weight_sgemm(const Tensor& b, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t ldb,
                  float* c) {
  thread_local dnnl::stream stream(engine());
  const auto p = plan_for({m, k, n, lda, ldb, tb ? 1 : 0});
  if (!p) return false;
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  const auto w = kept_weight(b, tb, *p, stream);
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
