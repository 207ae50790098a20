// Hierarchical all-reduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, NCCL's tree across nodes): the
// ranks of a node first reduce-scatter among themselves over the node's fast links, each rank then
// all-reduces its 1/L segment with the ranks of the same local rank on the other nodes, and the node
// all-gathers the result. What crosses between nodes per rank falls from the whole buffer to 1/L of it
// (L ranks per node).
#pragma once

#include <cstdint>
#include <memory>

#include "braid/distributed/process_group.h"

namespace braid::distributed {

struct HierarchicalOptions {
  /// Every ranks_per_node consecutive ranks of the group form a node; 0 takes the nodes from the
  /// hosts the ranks run on (BRAID_RANKS_PER_NODE overrides that, to try a layout on one machine).
  int ranks_per_node = 0;
  /// Buffers smaller than this go through the group's flat all-reduce: three phases cost three
  /// latencies, which small buffers do not earn back in bytes.
  int64_t min_bytes = 64 * 1024;
};

/// The group's layout across nodes.
struct NodeLayout {
  int nodes = 1, ranks_per_node = 1;
  int node = 0, local_rank = 0;
  /// Nodes of unequal size cannot share segments: such a group stays flat.
  bool even = true;
  /// More than one node with more than one rank each: the layout where the hierarchy saves bytes.
  bool hierarchical() const { return even && nodes > 1 && ranks_per_node > 1; }
};
/// Collective over group: the hosts (or the override) of its ranks, as a layout.
NodeLayout node_layout(const ProcessGroupPtr& group, const HierarchicalOptions& options = {});

/// A group whose all_reduce runs in three phases over its nodes, with every other collective and
/// split the group's own. Sums and averages of integer-valued data give the flat all-reduce's bits;
/// wire dtypes and deterministic order apply to the reduce-scatter and the cross-node all-reduce.
/// Collective over group; nullptr when the layout is not hierarchical() (one node, one rank per
/// node, or nodes of unequal size): use group itself then.
class HierarchicalGroup;
std::shared_ptr<HierarchicalGroup> make_hierarchical_group(const ProcessGroupPtr& group,
                                                           const HierarchicalOptions& options = {});

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(ProcessGroupPtr group, ProcessGroupPtr intra, ProcessGroupPtr inter, const NodeLayout& layout,
                    int64_t min_bytes);
  ~HierarchicalGroup() override;
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::string name() const override;
  int world_rank(int r) const override { return group_->world_rank(r); }
  WorkPtr all_reduce_async(Tensor t, ReduceOp op = ReduceOp::Sum, const AllReduceOptions& options = {}) override;
  void broadcast(Tensor t, int root) override { group_->broadcast(std::move(t), root); }
  Tensor all_gather(const Tensor& t) override { return group_->all_gather(t); }
  Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::Sum) override { return group_->reduce_scatter(t, op); }
  WorkPtr reduce_scatter_inplace_async(Tensor flat, ReduceOp op = ReduceOp::Sum,
                                       const AllReduceOptions& options = {}) override {
    return group_->reduce_scatter_inplace_async(std::move(flat), op, options);
  }
  WorkPtr all_gather_inplace_async(Tensor flat) override { return group_->all_gather_inplace_async(std::move(flat)); }
  void barrier() override { group_->barrier(); }
  WorkPtr isend(const Tensor& t, int dst, int tag = 0) override { return group_->isend(t, dst, tag); }
  WorkPtr irecv(Tensor t, int src, int tag = 0) override { return group_->irecv(std::move(t), src, tag); }
  std::shared_ptr<ProcessGroup> split(int color, int key) override { return group_->split(color, key); }
  /// The group's own traffic (what the program asked for); the phases' are intra()'s and inter()'s.
  Traffic traffic() const override;
  void reset_traffic() override;

  /// The ranks of this rank's node, and the ranks of the same local rank on every node.
  const ProcessGroupPtr& intra() const { return intra_; }
  const ProcessGroupPtr& inter() const { return inter_; }
  const NodeLayout& layout() const { return layout_; }

 private:
  struct Worker;
  ProcessGroupPtr group_, intra_, inter_;
  NodeLayout layout_;
  int64_t min_bytes_;
  std::unique_ptr<Worker> worker_;
};

}  // namespace braid::distributed
