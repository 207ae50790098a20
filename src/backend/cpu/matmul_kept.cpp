// float32 products by a kept weight through oneDNN's matmul primitive (Note [Kept float32 weights]).
#include "braid/config.h"

#ifdef BRAID_HAVE_DNNL
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

namespace {

// Note [Kept float32 weights]
// dnnl_sgemm packs B into its kernel's layout on every call. A product of a weight, the same B at
// the same version from one run to the next (an inference's Linear or MatMul by an initializer),
// goes instead to oneDNN's matmul primitive with B reordered once into the layout the primitive
// chose and kept with the storage (Storage::set_derived), as the int8 products (Note [Kept int8
// weights]) and the convolutions (Note [Reordered weights kept]) keep theirs. Measured with 2
// threads on the AVX-512 VM: 32x384 by 384x1536 (MiniLM's feed-forward at 32 tokens) 207 -> 158 us,
// 32x1536 by 1536x384 172 -> 128 us, 256x384 by 384x1536 1483 -> 1122 us. The first product of a
// storage in each orientation (B or its transpose) marks it and takes dnnl_sgemm, so that an
// activation, made afresh for every product, is never reordered for nothing, and a training step,
// which reads each weight once per orientation before the optimizer moves its version, never
// reorders either. Both compute each output as a float32 sum over K, in their own order.
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct Primitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// The primitive for A (M, K) with row stride lda by B (K, N) in the layout it picks, into C (M, N)
// row-major; null where oneDNN has none.
std::shared_ptr<const Primitive> primitive_for(int64_t m, int64_t k, int64_t n, int64_t lda) {
  static std::mutex mu;
  static std::map<std::array<int64_t, 4>, std::shared_ptr<const Primitive>> cache;
  const std::array<int64_t, 4> key{m, k, n, lda};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::shared_ptr<const Primitive> p;
  try {
    const dnnl::memory::desc a({m, k}, dt::f32, dnnl::memory::dims{lda, 1}), b({k, n}, dt::f32, tag::any),
        c({m, n}, dt::f32, tag::ab);
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine());
    p = std::make_shared<const Primitive>(Primitive{pd, dnnl::matmul(pd)});
  } catch (const dnnl::error&) {  // no kernel: dnnl_sgemm serves it
  }
  if (cache.size() >= 1024) cache.clear();  // shapes that vary from call to call
  cache.emplace(key, p);
  return p;
}

struct KeptWeight {
  dnnl::memory::desc desc;
  std::vector<float> data;
};

// B in the primitive's layout: kept with b's storage from the second product in this orientation
// on; null the first time.
std::shared_ptr<KeptWeight> kept_weight(const Tensor& b, bool tb, int64_t k, int64_t n, int64_t ldb, const Primitive& p,
                                        dnnl::stream& stream) {
  const std::shared_ptr<Storage>& st = b.storage();
  const std::string key = "onednn-f32-weight@" + std::to_string(b.offset()) + (tb ? "t" : "n");
  if (auto kept = std::static_pointer_cast<KeptWeight>(st->derived(key)); kept && kept->desc == p.pd.weights_desc())
    return kept;
  const std::string seen = key + "-seen";
  if (!st->derived(seen)) {
    st->set_derived(seen, std::make_shared<int>(1));
    return nullptr;
  }
  const uint64_t version = st->version();
  auto made = std::make_shared<KeptWeight>();
  made->desc = p.pd.weights_desc();
  made->data.resize(made->desc.get_size() / sizeof(float));
  const dnnl::memory::dims strides = tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1};
  dnnl::memory plain({{k, n}, dt::f32, strides}, engine(), const_cast<void*>(b.raw_data()));
  dnnl::memory inner(made->desc, engine(), made->data.data());
  dnnl::reorder(plain, inner).execute(stream, plain, inner);
  stream.wait();
  if (st->version() == version) st->set_derived(key, made);
  return made;
}

// A primitive's arguments, made once per thread and pointed at each call's memory.
struct Bound {
  std::shared_ptr<const Primitive> primitive;  // kept alive while its arguments are
  std::unordered_map<int, dnnl::memory> args;
};

}  // namespace

bool kept_weight_sgemm(const Tensor& b, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       int64_t ldb, float* c) {
  thread_local dnnl::stream stream(engine());
  const auto p = primitive_for(m, k, n, lda);
  if (!p) return false;
  OneDnnSignalGuard no_signals;  // Note [Signals and oneDNN's kernels]
  const auto w = kept_weight(b, tb, k, n, ldb, *p, stream);
  if (!w) return false;
  thread_local std::unordered_map<const Primitive*, Bound> bound;
  if (bound.size() > 256) bound.clear();
  Bound& bd = bound[p.get()];
  if (!bd.primitive) {
    bd.primitive = p;
    bd.args = {{DNNL_ARG_SRC, dnnl::memory(p->pd.src_desc(), engine(), const_cast<float*>(a))},
               {DNNL_ARG_WEIGHTS, dnnl::memory(p->pd.weights_desc(), engine(), w->data.data())},
               {DNNL_ARG_DST, dnnl::memory(p->pd.dst_desc(), engine(), c)}};
  }
  bd.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<float*>(a));
  bd.args.at(DNNL_ARG_WEIGHTS).set_data_handle(w->data.data());
  bd.args.at(DNNL_ARG_DST).set_data_handle(c);
  p->prim.execute(stream, bd.args);
  stream.wait();
  return true;
}

}  // namespace braid::detail

#endif
