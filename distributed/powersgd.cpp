// PowerSGD as a DistributedDataParallel communication hook.
//
// Note [PowerSGD]
// Per bucket, each parameter of two or more dimensions is the n x m matrix M (its first axis by
// the rest) plus, with error feedback, what earlier steps' approximations of it missed. One power
// iteration approximates the average over the ranks: P = M Q with the shared Q (m x r), averaged
// (all-reduce 1, which also carries the bucket's uncompressed parameters whole); P's columns are
// orthonormalised (Gram-Schmidt); Q = M^T P, averaged (all-reduce 2); the gradient applied is
// P Q^T = P P^T mean(M), the same on every rank. Each rank's error is its own M minus that. Q is
// kept for the next step (warm start), so the iteration refines across steps. When r = min(n, m)
// and P has full rank, P P^T projects onto mean(M)'s whole column space: the result is the
// average, up to rounding, for a fresh random Q (warm_start = false). A warm-started Q is the
// previous step's M^T P: step after step it turns towards the leading singular vectors (the point
// of warm start at low rank), so at full rank its columns grow as ill-conditioned as M and the
// smallest directions come back only to precision / condition number (7e-10 of the weights after
// 5 steps at 4 ranks in tests/test_comm_hooks.cpp's MLP, against 1e-16 with a fresh Q). A column of P with nothing left after projecting out the earlier ones
// becomes zero (no epsilon is added, so full rank stays exact). Traffic per matrix: r (n + m) elements in place of n m.
#include <cmath>

#include "braid/autograd.h"
#include "braid/distributed/comm_hooks.h"
#include "braid/ops.h"
#include "braid/random.h"

namespace braid::distributed {

namespace {

/// P with orthonormal columns spanning what P's did: Gram-Schmidt, each column projected twice
/// ("twice is enough"), so that the columns stay orthogonal to rounding even when P is close to
/// rank-deficient. A column that nothing is left of (its norm fell by the dtype's precision times
/// 1000, as when the gradient has lower rank than r: cross-entropy's last layer has rank at most
/// classes - 1) becomes zero instead of normalised noise.
Tensor orthonormalize(const Tensor& p) {
  const double eps = p.dtype() == kFloat64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  std::vector<Tensor> cols;
  for (int64_t c = 0; c < p.size(1); ++c) {
    Tensor col = p.narrow(1, c, 1);
    const double before = std::sqrt(sum(col * col).item());
    for (int pass = 0; pass < 2; ++pass)
      for (const Tensor& prev : cols) col = col - sum(col * prev) * prev;
    const double norm = std::sqrt(sum(col * col).item());
    cols.push_back(norm > before * 1000 * eps ? col * (1.0 / norm) : zeros_like(col));
  }
  return concat(cols, 1);
}

}  // namespace

struct PowerSGDHook::State {
  struct Matrix {
    size_t param = 0;
    int64_t n = 0, m = 0, r = 0;
    Tensor q, error, m_now, p;
  };
  bool planned = false, vanilla = false;
  std::vector<Matrix> matrices;
  std::vector<size_t> whole;  // parameters sent uncompressed
  Tensor first;               // P's and the whole parameters, flat
  WorkPtr work;
};

PowerSGDHook::PowerSGDHook(const PowerSGDOptions& o) : options_(o) {
  BRAID_CHECK(o.rank >= 1, "PowerSGDHook: rank must be at least 1, got ", o.rank);
  BRAID_CHECK(o.start_step >= 0 && o.min_compression_rate >= 0, "PowerSGDHook: start_step and min_compression_rate ",
              "must be >= 0, got ", o.start_step, " and ", o.min_compression_rate);
}

std::string PowerSGDHook::name() const {
  return detail::cat("PowerSGD (rank ", options_.rank, options_.error_feedback ? ", error feedback" : "", ")");
}

void PowerSGDHook::launch(const ProcessGroupPtr& group, GradBucket& b) {
  NoGradGuard no_grad;
  auto& sp = state_[b.index];
  if (!sp) sp = std::make_shared<State>();
  State& s = *sp;
  s.vanilla = b.step < options_.start_step;
  if (s.vanilla) {
    s.work = group->all_reduce_async(b.buffer, ReduceOp::Average);
    return;
  }
  if (!s.planned) {
    for (size_t j = 0; j < b.parameters.size(); ++j) {
      const Tensor& p = b.parameters[j];
      const int64_t n = p.dim() >= 2 ? p.size(0) : 0, m = n > 0 ? p.numel() / n : 0;
      const int64_t r = std::min({options_.rank, n, m});
      if (p.dim() < 2 || static_cast<double>(n * m) < options_.min_compression_rate * static_cast<double>(r * (n + m))) {
        s.whole.push_back(j);
        continue;
      }
      State::Matrix mat{j, n, m, r, {}, {}, {}, {}};
      const std::string key = detail::cat(b.index, ".", j, ".");
      if (auto q = restored_.find(key + "q"); q != restored_.end()) {
        BRAID_CHECK(q->second.shape() == Shape({m, r}), "PowerSGDHook: the restored Q of bucket ", b.index,
                    " parameter ", j, " has shape ", shape_str(q->second.shape()), ", expected ", shape_str({m, r}));
        mat.q = q->second.to(p.dtype()).to(p.device());
      } else {
        Generator gen(options_.seed + 7919 * b.index + j);
        mat.q = randn({m, r}, kFloat64, &gen).to(p.dtype()).to(p.device());
      }
      if (auto e = restored_.find(key + "error"); e != restored_.end()) mat.error = e->second.to(p.dtype()).to(p.device());
      s.matrices.push_back(std::move(mat));
    }
    s.planned = true;
  }
  std::vector<Tensor> flat;
  for (auto& mat : s.matrices) {
    Tensor M = b.buffer.narrow(0, b.offsets[mat.param], mat.n * mat.m).view({mat.n, mat.m});
    if (options_.error_feedback) {
      if (!mat.error.defined()) mat.error = zeros_like(M);
      M = M + mat.error;
    }
    mat.m_now = M;
    flat.push_back(matmul(M, mat.q).reshape({-1}));
  }
  for (size_t j : s.whole) flat.push_back(b.buffer.narrow(0, b.offsets[j], b.parameters[j].numel()));
  s.first = concat(flat, 0).contiguous();
  s.work = group->all_reduce_async(s.first, ReduceOp::Average);
}

void PowerSGDHook::finish(const ProcessGroupPtr& group, GradBucket& b) {
  NoGradGuard no_grad;
  auto it = state_.find(b.index);
  BRAID_CHECK(it != state_.end() && it->second->work, "PowerSGDHook: bucket ", b.index, " finished without being launched");
  State& s = *it->second;
  s.work->wait();
  s.work.reset();
  if (s.vanilla) return;
  int64_t at = 0;
  std::vector<Tensor> qs;
  for (auto& mat : s.matrices) {
    mat.p = orthonormalize(s.first.narrow(0, at, mat.n * mat.r).view({mat.n, mat.r}));
    at += mat.n * mat.r;
    qs.push_back(matmul(mat.m_now.mT(), mat.p).reshape({-1}));
  }
  for (size_t j : s.whole) {
    const int64_t len = b.parameters[j].numel();
    b.buffer.narrow(0, b.offsets[j], len).copy_(s.first.narrow(0, at, len));
    at += len;
  }
  if (s.matrices.empty()) return;
  Tensor second = concat(qs, 0).contiguous();
  group->all_reduce(second, ReduceOp::Average);
  at = 0;
  for (auto& mat : s.matrices) {
    Tensor q = second.narrow(0, at, mat.m * mat.r).view({mat.m, mat.r});
    at += mat.m * mat.r;
    const Tensor approx = matmul(mat.p, q.mT());
    if (options_.error_feedback) mat.error = mat.m_now - approx;
    b.buffer.narrow(0, b.offsets[mat.param], mat.n * mat.m).copy_(approx.reshape({-1}));
    if (options_.warm_start) {
      mat.q = q.clone();
    } else {
      Generator gen(options_.seed + 7919 * b.index + mat.param + 104729 * static_cast<uint64_t>(b.step + 1));
      mat.q = randn({mat.m, mat.r}, kFloat64, &gen).to(q.dtype()).to(q.device());
    }
    mat.m_now = Tensor(), mat.p = Tensor();
  }
  s.first = Tensor();
}

void PowerSGDHook::store(Checkpoint& ckpt, const std::string& prefix) const {
  for (const auto& [b, s] : state_)
    for (const auto& mat : s->matrices) {
      ckpt.tensors[detail::cat(prefix, b, ".", mat.param, ".q")] = mat.q.clone();
      if (mat.error.defined()) ckpt.tensors[detail::cat(prefix, b, ".", mat.param, ".error")] = mat.error.clone();
    }
}

void PowerSGDHook::restore(const Checkpoint& ckpt, const std::string& prefix) {
  // The plan is made again on the first step; the saved Q and error replace the fresh ones then.
  restored_ = {};
  for (const auto& [key, t] : ckpt.tensors)
    if (key.rfind(prefix, 0) == 0) restored_[key.substr(prefix.size())] = t.clone();
  state_.clear();
}

}  // namespace braid::distributed
