// DistributedDataParallel: model check and broadcast at start, gradient buckets filled by
// grad-ready hooks and all-reduced on the group's worker while backward goes on, and a callback at
// the end of backward that waits for the last buckets and writes the averaged gradients back.
#include "braid/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "braid/autograd.h"
#include "braid/distributed/hierarchical.h"
#include "braid/ops.h"
#include "distributed/internal.h"

namespace braid::distributed::detail {

namespace {

/// Every rank's list of lines (all_gather of lengths, then of the padded text).
std::vector<std::vector<std::string>> gather_lines(ProcessGroup& g, const std::vector<std::string>& lines);

}  // namespace

std::string describe_tensor(const std::string& kind, const std::string& name, const Tensor& t) {
  return kind + " '" + name + "' " + dtype_name(t.dtype()) + " " + shape_str(t.shape());
}

namespace {

std::vector<std::vector<std::string>> gather_lines(ProcessGroup& g, const std::vector<std::string>& lines) {
  std::string joined;
  for (const auto& l : lines) joined += l + "\n";
  Tensor len = full({1}, static_cast<double>(joined.size()), kInt64);
  const auto lens = g.all_gather(len).to_vector<int64_t>();
  int64_t longest = 0;
  for (int64_t l : lens) longest = std::max(longest, l);
  Tensor text = zeros({longest}, kInt32);
  auto* p = text.data<int32_t>();
  for (size_t i = 0; i < joined.size(); ++i) p[i] = static_cast<unsigned char>(joined[i]);
  Tensor all = g.all_gather(text);
  std::vector<std::vector<std::string>> out(static_cast<size_t>(g.size()));
  for (int r = 0; r < g.size(); ++r) {
    const auto v = all.select(0, r).to_vector<int32_t>();
    std::string cur;
    for (int64_t i = 0; i < lens[static_cast<size_t>(r)]; ++i) {
      const char c = static_cast<char>(v[static_cast<size_t>(i)]);
      if (c == '\n') {
        out[static_cast<size_t>(r)].push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
  }
  return out;
}

}  // namespace

void check_same_model(ProcessGroup& g, const std::vector<std::string>& lines, const char* who) {
  std::string joined;
  for (const auto& l : lines) joined += l + "\n";
  const uint64_t h = detail::fnv1a(joined.data(), joined.size());
  Tensor mine = full({1}, 0.0, kInt64);
  mine.data<int64_t>()[0] = static_cast<int64_t>(h);
  const auto hashes = g.all_gather(mine).to_vector<int64_t>();
  bool same = true;
  for (int64_t x : hashes) same = same && x == hashes[0];
  if (same) return;
  const auto all = gather_lines(g, lines);
  const auto& ref = all[0];
  for (int r = 1; r < g.size(); ++r) {
    const auto& other = all[static_cast<size_t>(r)];
    if (other == ref) continue;
    size_t i = 0;
    while (i < ref.size() && i < other.size() && ref[i] == other[i]) ++i;
    std::ostringstream os;
    os << who << ": the ranks built different models (group '" << g.name() << "'): ";
    if (i < ref.size() && i < other.size())
      os << "entry " << i << " is " << ref[i] << " on rank " << g.world_rank(0) << " but " << other[i] << " on rank "
         << g.world_rank(r);
    else if (i < ref.size())
      os << "rank " << g.world_rank(r) << " has no " << ref[i] << " (rank " << g.world_rank(0) << " has "
         << ref.size() << " entries, rank " << g.world_rank(r) << " " << other.size() << ")";
    else
      os << "rank " << g.world_rank(r) << " has an extra " << other[i] << " that rank " << g.world_rank(0)
         << " does not";
    os << "; every rank must construct the same model";
    throw DistributedError(os.str());
  }
}

void check_and_broadcast_model(nn::Module& module, ProcessGroup& group, bool broadcast_buffers, const char* who) {
  std::vector<std::string> lines;
  for (const auto& [name, p] : module.named_parameters()) lines.push_back(describe_tensor("parameter", name, p));
  const auto buffers = module.named_buffers();
  for (const auto& [name, b] : buffers) lines.push_back(describe_tensor("buffer", name, b));
  check_same_model(group, lines, who);
  NoGradGuard no_grad;
  for (const auto& [name, p] : module.named_parameters()) group.broadcast(p, 0);
  if (broadcast_buffers)
    for (const auto& [name, b] : buffers) group.broadcast(b, 0);
}

// Buckets in reverse registration order: backward produces the last layers' gradients first.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<Tensor>& params, double cap_mb) {
  const double cap = cap_mb * 1024.0 * 1024.0;
  std::vector<std::vector<size_t>> buckets;
  std::vector<std::pair<size_t, int64_t>> open;  // (bucket, elements) being filled, per dtype and device
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k];
    const double bytes = static_cast<double>(p.numel() * p.element_size());
    size_t found = SIZE_MAX;
    for (size_t o = 0; o < open.size(); ++o) {
      const Tensor& first = params[buckets[open[o].first].front()];
      if (first.dtype() == p.dtype() && first.device() == p.device()) found = o;
    }
    if (found != SIZE_MAX &&
        (cap == 0 || static_cast<double>(open[found].second * p.element_size()) + bytes > cap)) {
      open.erase(open.begin() + static_cast<long>(found));
      found = SIZE_MAX;
    }
    if (found == SIZE_MAX) {
      buckets.emplace_back();
      open.emplace_back(buckets.size() - 1, 0);
      found = open.size() - 1;
    }
    buckets[open[found].first].push_back(k);
    open[found].second += p.numel();
  }
  return buckets;
}

}  // namespace braid::distributed::detail

namespace braid::distributed {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct DistributedDataParallel::Bucket {
  DType dtype = kFloat32;
  Device device;  // the parameters' device: buckets never mix dtypes or devices
  std::vector<size_t> params;
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  size_t pending = 0;
  Tensor flat;
  GradBucket grad;  // flat, as the hook sees it
  bool launched = false;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroupPtr group,
                                                 const DataParallelOptions& options)
    : module_(std::move(module)), group_(group ? std::move(group) : world()), options_(options) {
  BRAID_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null");
  BRAID_CHECK(options_.bucket_cap_mb >= 0, "DistributedDataParallel: bucket_cap_mb must be >= 0, got ",
              options_.bucket_cap_mb);
  for (const auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    names_.push_back(name);
    params_.push_back(p);
  }
  detail::check_and_broadcast_model(*module_, *group_, options_.broadcast_buffers, "DistributedDataParallel");
  if (options_.hierarchical)
    if (auto h = make_hierarchical_group(group_)) group_ = std::move(h);
  BRAID_CHECK(!options_.autotune || (!options_.autotune_caps_mb.empty() && options_.autotune_steps >= 1),
              "DistributedDataParallel: autotune needs at least one cap in autotune_caps_mb and autotune_steps >= 1");
  for (double c : options_.autotune_caps_mb)
    BRAID_CHECK(c >= 0, "DistributedDataParallel: autotune_caps_mb holds ", c, "; caps must be >= 0");
  make_buckets(options_.autotune ? options_.autotune_caps_mb[0] : options_.bucket_cap_mb);
  AllReduceOptions o;
  o.wire_dtype = options_.wire_dtype;
  o.deterministic = options_.deterministic;
  hook_ = allreduce_hook(o);
  ready_.assign(params_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k)
    hook_ids_.push_back(add_grad_ready_hook(params_[k], [this, k] { on_grad_ready(k); }));
}

void DistributedDataParallel::make_buckets(double cap_mb) {
  cap_mb_ = cap_mb;
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  for (const auto& plan : detail::plan_buckets(params_, cap_mb)) {
    auto& b = *buckets_.emplace_back(std::make_unique<Bucket>());
    b.dtype = params_[plan.front()].dtype();
    b.device = params_[plan.front()].device();
    for (size_t k : plan) {
      b.params.push_back(k);
      b.offsets.push_back(b.numel);
      b.numel += params_[k].numel();
      bucket_of_[k] = buckets_.size() - 1;
    }
  }
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = *buckets_[i];
    b.flat = zeros({b.numel}, b.dtype, b.device);
    b.grad.index = i;
    b.grad.buffer = b.flat;
    b.grad.offsets = b.offsets;
    for (size_t k : b.params) b.grad.parameters.push_back(params_[k]);
  }
}

double choose_bucket_cap(const std::vector<double>& caps_mb, const std::vector<std::vector<double>>& seconds) {
  BRAID_CHECK(!caps_mb.empty() && caps_mb.size() == seconds.size(), "choose_bucket_cap: ", caps_mb.size(), " caps and ",
              seconds.size(), " lists of times");
  size_t best = 0;
  double best_median = 0;
  for (size_t i = 0; i < caps_mb.size(); ++i) {
    BRAID_CHECK(!seconds[i].empty(), "choose_bucket_cap: no times for the cap of ", caps_mb[i], " MB");
    std::vector<double> t = seconds[i];
    std::sort(t.begin(), t.end());
    const double median = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
    if (i == 0 || median < best_median) best = i, best_median = median;
  }
  return caps_mb[best];
}

// Note [Bucket autotuning]: every rank times the same steps; each cap's times are the slowest rank's
// (one all-reduce of max when a cap's steps are done), so every rank makes the same choice and the
// buckets, which must match across ranks, are planned again identically. Buckets only live within a
// backward pass, so replanning between steps is free.
void DistributedDataParallel::autotune_step(double seconds) {
  const auto& caps = options_.autotune_caps_mb;
  if (!options_.autotune || tuning_ >= caps.size()) return;
  if (tuned_seconds_.size() <= tuning_) tuned_seconds_.emplace_back();
  tuned_seconds_[tuning_].push_back(seconds);
  if (static_cast<int>(tuned_seconds_[tuning_].size()) < options_.autotune_steps) return;
  Tensor t = tensor(tuned_seconds_[tuning_], {static_cast<int64_t>(tuned_seconds_[tuning_].size())}, Device::cpu());
  group_->all_reduce(t, ReduceOp::Max);
  tuned_seconds_[tuning_] = t.to_vector<double>();
  if (++tuning_ < caps.size()) {
    make_buckets(caps[tuning_]);
    return;
  }
  const double chosen = choose_bucket_cap(caps, tuned_seconds_);
  std::ostringstream os;
  for (size_t i = 0; i < caps.size(); ++i) {
    std::vector<double> v = tuned_seconds_[i];
    std::sort(v.begin(), v.end());
    os << "bucket cap " << caps[i] << " MB: median " << v[v.size() / 2] * 1e3 << " ms per backward over "
       << v.size() << " steps\n";
  }
  os << "chosen: " << chosen << " MB";
  autotune_report_ = os.str();
  make_buckets(chosen);
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t k = 0; k < params_.size(); ++k) remove_grad_ready_hook(params_[k], hook_ids_[k]);
  for (auto& b : buckets_) {
    if (!b->launched) continue;
    try {
      hook_->finish(group_, b->grad);
    } catch (...) {  // the error was (or will be) reported by the backward that launched it
    }
  }
}

void DistributedDataParallel::register_comm_hook(CommHookPtr hook) {
  BRAID_CHECK(hook != nullptr, "DistributedDataParallel::register_comm_hook: the hook is null");
  BRAID_CHECK(!options_.autotune, "DistributedDataParallel::register_comm_hook: autotune replans the buckets, which ",
              "a hook's per-bucket state would not follow; construct without autotune to use ", hook->name());
  BRAID_CHECK(steps_ == 0 && !in_backward_, "DistributedDataParallel::register_comm_hook: register the hook before ",
              "the first backward (", steps_, " have run with ", hook_->name(), ")");
  hook_ = std::move(hook);
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    auto& names = out.emplace_back();
    for (size_t k : b->params) names.push_back(names_[k]);
  }
  return out;
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  if (!sync_) return;
  if (!in_backward_) {
    in_backward_ = true;
    std::fill(ready_.begin(), ready_.end(), false);
    for (auto& b : buckets_) b->pending = b->params.size();
    next_launch_ = 0;
    first_launch_time_ = now_seconds();
    queue_backward_callback([this] { finish_backward(); });
    if (join_) active_ranks_ = join_->count_active(true);  // before any bucket: Note [Join]
  }
  if (ready_[k]) return;
  ready_[k] = true;
  if (--buckets_[bucket_of_[k]]->pending == 0) launch_ready_buckets();
}

// Buckets are launched strictly in index order, so that every rank issues its all-reduces in the
// same order even when gradients become ready in a different order on different ranks.
void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) launch(next_launch_++);
}

void DistributedDataParallel::launch(size_t i) {
  Bucket& b = *buckets_[i];
  NoGradGuard no_grad;
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    Tensor slot = b.flat.narrow(0, b.offsets[j], p.numel());
    const Tensor g = p.grad();
    if (g.defined() && ready_[b.params[j]]) slot.copy_(g.reshape({p.numel()}));
    else slot.zero_();
  }
  b.grad.step = steps_;
  b.launched = true;
  hook_->launch(group_, b.grad);
}

void DistributedDataParallel::finish_buckets() {
  for (auto& b : buckets_) {
    if (!b->launched) continue;
    b->launched = false;
    hook_->finish(group_, b->grad);
  }
}

// A rank that has finished its data under a Join runs a step's collectives with zero gradients
// (Note [Join] in join.cpp).
void DistributedDataParallel::shadow_backward() {
  NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b->flat.zero_();
    b->grad.step = steps_;
    b->launched = true;
    hook_->launch(group_, b->grad);
  }
  finish_buckets();
  if (options_.find_unused_parameters) {
    Tensor used = zeros({static_cast<int64_t>(params_.size())}, kFloat32);
    group_->all_reduce(used, ReduceOp::Max);
  }
}

void DistributedDataParallel::finish_backward() {
  in_backward_ = false;
  std::vector<std::string> unused;
  for (size_t k = 0; k < params_.size(); ++k)
    if (!ready_[k]) unused.push_back(names_[k]);
  if (!unused.empty() && !options_.find_unused_parameters) {
    // Still reduce, so that the other ranks are not left waiting, then report.
    for (auto& b : buckets_) b->pending = 0;
    launch_ready_buckets();
    finish_buckets();
    ++steps_;
    std::ostringstream os;
    for (size_t i = 0; i < unused.size() && i < 10; ++i) os << (i ? ", " : "") << "'" << unused[i] << "'";
    if (unused.size() > 10) os << " and " << unused.size() - 10 << " more";
    throw ValueError(::braid::detail::cat(
        "DistributedDataParallel: ", unused.size(), " of ", params_.size(), " parameters received no gradient in "
        "this backward on rank ", group_->world_rank(group_->rank()), ": ", os.str(),
        ". Construct it with find_unused_parameters = true, or use them in forward"));
  }
  for (auto& b : buckets_) b->pending = 0;
  launch_ready_buckets();
  const double t0 = now_seconds();
  finish_buckets();
  ++steps_;
  const double t1 = now_seconds();
  Tensor used;
  if (options_.find_unused_parameters) {
    used = zeros({static_cast<int64_t>(params_.size())}, kFloat32);
    auto* u = used.data<float>();
    for (size_t k = 0; k < params_.size(); ++k) u[k] = ready_[k] ? 1.0f : 0.0f;
    group_->all_reduce(used, ReduceOp::Max);
  }
  NoGradGuard no_grad;
  stats_ = {};
  for (auto& b : buckets_) {
    for (size_t j = 0; j < b->params.size(); ++j) {
      Tensor p = params_[b->params[j]];
      if (used.defined() && used.data<float>()[b->params[j]] == 0.0f) {
        p.set_grad(Tensor());
        continue;
      }
      Tensor avg = b->flat.narrow(0, b->offsets[j], p.numel()).view(p.shape());
      Tensor g = p.grad();
      if (g.defined()) g.copy_(avg);
      else p.set_grad(avg.clone());
    }
    stats_.buckets += 1;
    stats_.bytes += b->numel * dtype_size(b->dtype);
  }
  if (join_ && !join_->options().divide_by_initial_world_size && active_ranks_ < group_->size())
    for (const Tensor& p : params_)
      if (p.grad().defined()) Tensor(p.grad()).mul_(static_cast<double>(group_->size()) / active_ranks_);
  stats_.backward_seconds = t0 - first_launch_time_;
  stats_.exposed_seconds = t1 - t0;
  autotune_step(t1 - first_launch_time_);
}

}  // namespace braid::distributed
