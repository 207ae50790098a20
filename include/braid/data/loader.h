// DataLoader: turns a Dataset into an epoch's sequence of batches, with per-epoch seeded
// shuffling, sharding across ranks, transforms, a background prefetch thread, and a position
// (epoch, batch) that a checkpoint saves so that a resumed run sees exactly the remaining batches.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "braid/data/dataset.h"
#include "braid/data/transforms.h"

namespace braid::data {

struct DataLoaderOptions {
  /// Samples per batch on each shard.
  int64_t batch_size = 1;
  /// Shuffle each epoch with a permutation drawn from (seed, epoch): the same on every rank.
  bool shuffle = false;
  /// Leave out the last, short batch (see the sharding rule below).
  bool drop_last = false;
  uint64_t seed = 0;
  /// Batches a background thread prepares ahead of the consumer; 0 prepares each in next().
  int64_t prefetch = 2;
  /// Sharding for data-parallel training: this loader yields shard `shard` of `num_shards`.
  int64_t num_shards = 1;
  int64_t shard = 0;
  /// Applied in order to each batch's input; random ones draw from streams keyed by (seed, epoch).
  std::vector<std::shared_ptr<const Transform>> transforms = {};
  /// Where batches are handed out; unset, they stay where the dataset made them. Set, each batch is
  /// moved there by the prefetch thread, so the transfer of batch i + 1 overlaps the step on batch i
  /// (Note [Batches on a device] in src/data/loader.cpp).
  std::optional<Device> device = std::nullopt;
};

/// A batch: the stacked examples and where they came from.
struct Batch {
  Tensor input;
  Tensor target;
  /// Dataset indices of the rows, in order.
  std::vector<int64_t> indices;
  int64_t epoch = 0;
  /// Position of this batch within its epoch on this shard (0-based).
  int64_t index = 0;
};

// Note [Sharding rule]
// An epoch is a permutation of the dataset's S indices (the identity without shuffle), cut into
// global batches of G = num_shards * batch_size positions. Global batch j gives shard r the
// positions [j G + r b, j G + (r + 1) b), so N shards with batch b see, step by step, exactly the
// samples one loader with batch N b sees. The remainder R = S mod G:
//  - drop_last: left out; every shard has floor(S / G) batches of b samples, and the R samples
//    left out differ from epoch to epoch as the permutation changes;
//  - otherwise: one more, last batch on every shard, R split into contiguous pieces whose sizes
//    differ by at most one (shards r < R mod N get one more). Every shard therefore has the same
//    number of batches, ceil(S / G), as collectives need, and each sample is seen exactly once per
//    epoch; when R < N, the last batch of some shards is empty (a leading axis of 0).
// Data-parallel training that averages gradients per rank should use drop_last.

/// Iterates one epoch at a time: next() returns false once at the end of an epoch and moves the
/// position to the start of the next one, so `while (loader.next(b))` inside an epoch loop walks
/// every epoch in turn. The loader is used from one thread.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options = {});
  /// Stops the prefetch thread (waiting for at most the batch it is preparing).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Batches per epoch on this shard.
  int64_t num_batches() const;
  /// Samples per epoch on this shard.
  int64_t num_samples() const;
  const DataLoaderOptions& options() const { return opts_; }
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }

  /// The next batch of the epoch in out, or false at the end of the epoch. An exception from the
  /// dataset or a transform (also one raised in the prefetch thread) propagates unchanged; the
  /// position stays at the failing batch, so calling next() again retries it.
  bool next(Batch& out);
  /// The epoch the next batch belongs to.
  int64_t epoch() const { return epoch_; }
  /// Batches of epoch() already consumed: the index of the next batch.
  int64_t batch() const { return batch_; }
  /// Moves to batch `batch` of `epoch` (0 <= batch <= num_batches()); what a checkpoint restores.
  void seek(int64_t epoch, int64_t batch);
  /// seek(epoch, 0).
  void set_epoch(int64_t epoch) { seek(epoch, 0); }

  /// The dataset indices of batch `index` of `epoch` on this shard, without loading anything.
  std::vector<int64_t> batch_indices(int64_t epoch, int64_t index) const;

  /// Range-for over the rest of the current epoch: `for (Batch& b : loader)`.
  class Iterator {
   public:
    Iterator() = default;  // the end
    explicit Iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    Batch& operator*() { return batch_; }
    Iterator& operator++() {
      if (!loader_->next(batch_)) loader_ = nullptr;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return loader_ != o.loader_; }

   private:
    DataLoader* loader_ = nullptr;
    Batch batch_;
  };
  Iterator begin() { return Iterator(this); }
  Iterator end() { return Iterator(); }

 private:
  // The epoch's permutation, computed once per epoch by whichever thread makes batches.
  struct Plan {
    int64_t epoch = -1;
    std::vector<int64_t> order;
  };
  // One queue entry: a batch, the end of an epoch, or the exception that making a batch raised.
  struct Item {
    Batch batch;
    bool end_of_epoch = false;
    std::exception_ptr error;
  };
  // The batch's indices, and with load its tensors (gathered and transformed).
  Batch make_batch(Plan& plan, int64_t epoch, int64_t index, bool load) const;
  void start_worker();
  void stop_worker();
  void worker_loop(int64_t epoch, int64_t index);

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opts_;
  int64_t epoch_ = 0, batch_ = 0;
  Plan plan_;  // synchronous mode's

  // Prefetch: the worker fills queue_ with the batches that follow the consumer's position.
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
};

}  // namespace braid::data
