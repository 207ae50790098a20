// Checkpoints of sharded training (Note [Sharded checkpoints] in sharded.h): each rank's shard by
// parameter name, the join of N shards into an unsharded checkpoint, the cut of one for this
// rank's segments, and the multi-file save behind one manifest.
#include <cstdio>
#include <filesystem>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "distributed/internal.h"
#include "distributed/sharded_internal.h"

namespace braid::distributed {

namespace {

struct Piece {
  int64_t lo, hi;  // within the bucket's flat buffer, clipped to this rank's segment
  int64_t offset;  // where lo falls in the flattened parameter
};

// The part of parameter j of bucket b inside [b.begin, b.end), or hi <= lo.
Piece piece_of(const ShardedDataParallel::Bucket& b, size_t j) {
  const int64_t start = b.offsets[j];
  const int64_t stop = j + 1 < b.params.size() ? b.offsets[j + 1] : b.numel;
  const int64_t lo = std::max(start, b.begin), hi = std::min(stop, b.end);
  return {lo, hi, lo - start};
}

Tensor shape_tensor(const Shape& s) {
  Tensor t = zeros({static_cast<int64_t>(s.size())}, kInt64);
  for (size_t i = 0; i < s.size(); ++i) t.data<int64_t>()[i] = s[i];
  return t;
}

}  // namespace

Checkpoint ShardedDataParallel::state_shard() const {
  NoGradGuard no_grad;
  Checkpoint c;
  c.integers["ranks"] = group_->size();
  c.integers["rank"] = group_->rank();
  const optim::OptimizerState os = optimizer_->state_dict();
  for (const auto& [key, v] : os.scalars)
    if (key.rfind("group.", 0) == 0) c.scalars["optim." + key] = v;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = *buckets_[i];
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Piece p = piece_of(b, j);
      if (p.hi <= p.lo) continue;
      const std::string name = names_[b.params[j]];
      c.tensors["model." + name] = b.shard.detach().narrow(0, p.lo - b.begin, p.hi - p.lo).clone();
      c.tensors["model." + name + ".shape"] = shape_tensor(b.shapes[j]);
      c.integers["model." + name + ".offset"] = p.offset;
      c.integers["model." + name + ".index"] = static_cast<int64_t>(b.params[j]);
      const std::string prefix = "state." + std::to_string(i) + ".";
      for (const auto& [key, t] : os.tensors)
        if (key.rfind(prefix, 0) == 0)
          c.tensors["optim." + name + "." + key.substr(prefix.size())] = t.narrow(0, p.lo - b.begin, p.hi - p.lo).clone();
      for (const auto& [key, v] : os.scalars)
        if (key.rfind(prefix, 0) == 0) c.scalars["optim." + name + "." + key.substr(prefix.size())] = v;
    }
  }
  for (const auto& [name, t] : module_->named_buffers()) c.tensors["buffer." + name] = t.detach().clone();
  return c;
}

Checkpoint ShardedDataParallel::unshard(const std::vector<Checkpoint>& shards) {
  BRAID_CHECK(!shards.empty(), "ShardedDataParallel::unshard: no shards given");
  NoGradGuard no_grad;
  Checkpoint full;
  struct Param {
    Tensor value;
    std::map<std::string, Tensor> state;
    Shape shape;
    int64_t covered = 0;
    int64_t index = 0;
  };
  std::map<std::string, Param> params;
  for (const Checkpoint& c : shards) {
    for (const auto& [key, t] : c.tensors) {
      if (key.rfind("model.", 0) != 0 || (key.size() > 6 && key.compare(key.size() - 6, 6, ".shape") == 0)) continue;
      const std::string name = key.substr(6);
      Param& p = params[name];
      if (!p.value.defined()) {
        const auto dims = c.tensor(key + ".shape").to_vector<int64_t>();
        p.shape = Shape(dims.begin(), dims.end());
        p.value = zeros(p.shape, t.dtype()).reshape({-1});
      }
      const int64_t off = c.integer(key + ".offset");
      BRAID_CHECK(off >= 0 && off + t.numel() <= p.value.numel(), "ShardedDataParallel::unshard: the piece of '", name,
                  "' in ", c.source.empty() ? "a shard" : c.source, " lies outside its ", p.value.numel(), " elements");
      p.value.narrow(0, off, t.numel()).copy_(t);
      p.covered += t.numel();
      p.index = c.integer(key + ".index");
      const std::string sprefix = "optim." + name + ".";
      for (const auto& [skey, st] : c.tensors)
        if (skey.rfind(sprefix, 0) == 0) {
          Tensor& dst = p.state[skey.substr(sprefix.size())];
          if (!dst.defined()) dst = zeros({p.value.numel()}, st.dtype());
          dst.narrow(0, off, st.numel()).copy_(st);
        }
      for (const auto& [skey, v] : c.scalars)
        if (skey.rfind(sprefix, 0) == 0)
          full.scalars["optim.state." + std::to_string(p.index) + "." + skey.substr(sprefix.size())] = v;
    }
  }
  for (auto& [name, p] : params) {
    BRAID_CHECK(p.covered == p.value.numel(), "ShardedDataParallel::unshard: the shards hold ", p.covered, " of the ",
                p.value.numel(), " elements of parameter '", name, "'; pass every rank's shard");
    full.tensors["model." + name] = p.value.reshape(p.shape);
    for (auto& [s, t] : p.state) full.tensors["optim.state." + std::to_string(p.index) + "." + s] = t.reshape(p.shape);
  }
  for (const auto& [key, v] : shards[0].scalars)
    if (key.rfind("optim.group.", 0) == 0) full.scalars[key] = v;
  if (full.scalars.count("optim.group.0.num_params"))
    full.scalars["optim.group.0.num_params"] = static_cast<double>(params.size());
  for (const auto& [key, t] : shards[0].tensors)
    if (key.rfind("buffer.", 0) == 0) full.tensors["model." + key.substr(7)] = t;
  // The rest (a run's step, RNG and loader position) from the first shard.
  for (const auto& [key, v] : shards[0].integers)
    if (key != "ranks" && key != "rank" && key.rfind("model.", 0) != 0) full.integers[key] = v;
  for (const auto& [key, v] : shards[0].scalars)
    if (key.rfind("optim.", 0) != 0 && key.rfind("model.", 0) != 0) full.scalars[key] = v;
  for (const auto& [key, t] : shards[0].tensors)
    if (key.rfind("optim.", 0) != 0 && key.rfind("model.", 0) != 0 && key.rfind("buffer.", 0) != 0) full.tensors[key] = t;
  full.strings = shards[0].strings;
  return full;
}

void ShardedDataParallel::load_full(const Checkpoint& full) {
  NoGradGuard no_grad;
  // Check everything before changing anything.
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& t = full.tensor("model." + names_[k]);
    const Shape& want = buckets_[bucket_of_[k]]->shapes[static_cast<size_t>(
        std::find(buckets_[bucket_of_[k]]->params.begin(), buckets_[bucket_of_[k]]->params.end(), k) -
        buckets_[bucket_of_[k]]->params.begin())];
    BRAID_CHECK(t.shape() == want, "ShardedDataParallel::load_full: '", names_[k], "' is ", shape_str(t.shape()), " in ",
                full.source.empty() ? "the checkpoint" : full.source, " but ", shape_str(want), " in the model");
  }
  optim::OptimizerState os;
  for (const auto& [key, v] : full.scalars)
    if (key.rfind("optim.group.", 0) == 0) os.scalars[key.substr(6)] = v;
  if (os.scalars.count("group.0.num_params")) os.scalars["group.0.num_params"] = static_cast<double>(buckets_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = *buckets_[i];
    std::map<std::string, Tensor> seg;  // state name -> this rank's segment
    for (size_t j = 0; j < b.params.size(); ++j) {
      const size_t k = b.params[j];
      const std::string base = "optim.state." + std::to_string(k) + ".";
      const Piece p = piece_of(b, j);
      for (const auto& [key, t] : full.tensors) {
        if (key.rfind(base, 0) != 0) continue;
        Tensor& dst = seg[key.substr(base.size())];
        if (!dst.defined()) dst = zeros({b.end - b.begin}, t.dtype());
        if (p.hi > p.lo) dst.narrow(0, p.lo - b.begin, p.hi - p.lo).copy_(t.reshape({-1}).narrow(0, p.offset, p.hi - p.lo));
      }
      for (const auto& [key, v] : full.scalars)
        if (key.rfind(base, 0) == 0) os.scalars["state." + std::to_string(i) + "." + key.substr(base.size())] = v;
    }
    for (auto& [name, t] : seg) os.tensors["state." + std::to_string(i) + "." + name] = t;
  }
  if (!os.scalars.empty()) optimizer_->load_state_dict(os);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = *buckets_[i];
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor flat = full.tensor("model." + names_[b.params[j]]).reshape({-1});
      const Piece p = piece_of(b, j);
      if (p.hi > p.lo) b.shard.detach().narrow(0, p.lo - b.begin, p.hi - p.lo).copy_(flat.narrow(0, p.offset, p.hi - p.lo));
      if (!b.unit) b.flat.narrow(0, b.offsets[j], flat.numel()).copy_(flat);
    }
    if (!b.unit) b.flat.storage()->bump_version();
    b.has_grad = false;
    b.shard_grad = Tensor();
  }
  for (const auto& [name, t] : module_->named_buffers()) {
    auto it = full.tensors.find("model." + name);
    if (it != full.tensors.end()) Tensor(t).copy_(it->second);
  }
}

void save_sharded_checkpoint(const std::string& path, const Checkpoint& mine, const ProcessGroupPtr& group_in) {
  ProcessGroupPtr group = group_in ? group_in : world();
  namespace fs = std::filesystem;
  // Rank 0 reads the manifest in place, if any, for its generation and files.
  Tensor gen = zeros({1}, kInt64);
  Checkpoint old;
  if (group->rank() == 0 && fs::exists(path)) {
    old = load_checkpoint(path);
    gen.data<int64_t>()[0] = old.integer("generation");
  }
  group->broadcast(gen, 0);
  const int64_t next = gen.data<int64_t>()[0] + 1;
  const std::string file = path + ".g" + std::to_string(next) + ".rank" + std::to_string(group->rank());
  save_checkpoint(file, mine);
  group->barrier();
  if (group->rank() == 0) {
    Checkpoint manifest;
    manifest.integers["generation"] = next;
    manifest.integers["ranks"] = group->size();
    for (int r = 0; r < group->size(); ++r)
      manifest.strings["file." + std::to_string(r)] =
          fs::path(path + ".g" + std::to_string(next) + ".rank" + std::to_string(r)).filename().string();
    save_checkpoint(path, manifest);
    if (!old.integers.empty())
      for (int64_t r = 0; r < old.integer("ranks"); ++r) {
        std::error_code ec;
        fs::remove(fs::path(path).parent_path() / old.string("file." + std::to_string(r)), ec);
      }
  }
  group->barrier();
}

std::vector<Checkpoint> load_sharded_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  const Checkpoint manifest = load_checkpoint(path);
  std::vector<Checkpoint> out;
  for (int64_t r = 0; r < manifest.integer("ranks"); ++r)
    out.push_back(load_checkpoint((fs::path(path).parent_path() / manifest.string("file." + std::to_string(r))).string()));
  return out;
}

}  // namespace braid::distributed
