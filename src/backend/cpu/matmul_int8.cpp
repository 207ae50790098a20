// int8 matrix products through oneDNN (Note [int8 GEMM through oneDNN]): its matmul primitive on a
// weight reordered once and kept (Note [Kept int8 weights]), or its GEMM routine.
#include "braid/config.h"

#ifdef BRAID_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace braid::detail {

namespace {

// Note [Kept int8 weights]
// dnnl_gemm_u8s8s32 packs B into its kernel's layout on every call: at the row counts of a
// transformer at batch 1 (32 tokens) that was a third of the product's time (32x1536 by 1536x384:
// 33 us against 20). A B that the same storage gives again at the same version (a quantised
// model's weight) goes instead to oneDNN's matmul primitive, B reordered into the layout it chose
// and kept with the storage (Storage::set_derived), as the convolutions keep theirs (Note
// [Reordered weights kept]). The first product of a storage marks it and takes the GEMM routine, so
// that activations, made afresh for every product, are never reordered for nothing. The primitive
// takes A's zero point at run time and B's as zero (a symmetric weight: onnxruntime's int8
// quantisers write those); the sums are the same exact int32 sums either way.
struct Primitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::shared_ptr<const Primitive> primitive_for(int64_t m, int64_t k, int64_t n) {
  static std::mutex mu;
  static std::unordered_map<int64_t, std::shared_ptr<const Primitive>> cache;  // by (m, k, n)
  const int64_t key = (m * 1000003 + k) * 1000003 + n;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  std::shared_ptr<const Primitive> p;
  try {
    dnnl::primitive_attr attr;
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    const dnnl::memory::desc a({m, k}, dt::u8, tag::ab), b({k, n}, dt::s8, tag::any), c({m, n}, dt::s32, tag::ab);
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
    p = std::make_shared<const Primitive>(Primitive{pd, dnnl::matmul(pd)});
  } catch (const dnnl::error&) {  // no kernel: the GEMM routine serves it
  }
  if (cache.size() >= 1024) cache.clear();  // shapes that vary from call to call
  cache.emplace(key, p);
  return p;
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
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::memory plain({{b.size(0), b.size(1)}, dt::s8, tag::ab}, engine(), const_cast<void*>(b.raw_data()));
  dnnl::memory inner(made->desc, engine(), made->data.data());
  dnnl::reorder(plain, inner).execute(stream, plain, inner);
  stream.wait();
  if (st->version() == version) st->set_derived(key, made);
  return made;
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
  static const bool vnni = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    return (isa & 0x40u) != 0 || (isa & 0x400u) != 0;  // avx512_core_vnni's or avx2_vnni's bit
  }();
  if (!onednn_enabled() || !vnni) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    std::fill_n(out.data<int32_t>(), m * n, 0);
    return true;
  }
  std::vector<uint8_t> a_shifted;
  const uint8_t* pa = nullptr;
  if (a.dtype() == kUInt8) {
    pa = a.data<uint8_t>();
  } else {
    const int8_t* src = a.data<int8_t>();
    a_shifted.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m * k; ++i) a_shifted[static_cast<size_t>(i)] = static_cast<uint8_t>(src[i] + 128);
    pa = a_shifted.data();
    a_zero += 128;
  }
  OneDnnSignalGuard no_signals;             // Note [Signals and oneDNN's kernels]
  if (b.dtype() == kInt8 && b_zero == 0) {  // Note [Kept int8 weights]
    thread_local dnnl::stream stream(engine());
    if (const auto p = primitive_for(m, k, n))
      if (const auto w = kept_weight(b, *p, stream)) {
        using dt = dnnl::memory::data_type;
        using tag = dnnl::memory::format_tag;
        int32_t zero = static_cast<int32_t>(a_zero);
        dnnl::memory am({{m, k}, dt::u8, tag::ab}, engine(), const_cast<uint8_t*>(pa));
        dnnl::memory bm(w->desc, engine(), w->data.data());
        dnnl::memory cm({{m, n}, dt::s32, tag::ab}, engine(), out.data<int32_t>());
        dnnl::memory zm({{1}, dt::s32, tag::x}, engine(), &zero);
        p->prim.execute(stream, {{DNNL_ARG_SRC, am},
                                 {DNNL_ARG_WEIGHTS, bm},
                                 {DNNL_ARG_DST, cm},
                                 {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zm}});
        stream.wait();
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

}  // namespace braid::detail

#endif
