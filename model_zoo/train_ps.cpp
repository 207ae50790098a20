// braid-train --ps S: see train_ps.h. The workers' metrics reduce over a group of the workers alone,
// since the servers are in ParameterServer::serve() until every worker has finished.
//
// Note [Parameter-server checkpoints]
// The state of a run is spread out: the variables are the servers' (every worker holds them after
// finish()), each server's optimizer state and learning-rate schedule are its own, and the position
// in the data is the workers'. So a run stops at a point every worker agrees on: on static shards
// the workers decide after each step, together (preemption_requested over the workers); with
// dynamic batches a worker that sees a signal asks server 0 to finish the round begun
// (next_batch(stop)), and --stop-at-step N hands out N rounds. Then, after finish(), the first
// worker tells every rank the step; each server writes checkpoint.ps<rank>.step<N>.braid (its
// optimizer and schedule), and only then the first worker writes checkpoint.braid (the variables,
// the step, the loader, the layout), after which the servers delete their files of other steps. A
// crash between the two leaves the previous checkpoint.braid with its own server files in place.
// --resume takes checkpoint.braid (or its folder) with the same servers and workers: synchronous
// and staleness-0 dynamic runs continue bit for bit.
#include "train_ps.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "braid/checkpoint.h"
#include "braid/data/progress.h"
#include "braid/distributed.h"
#include "braid/nn/loss.h"
#include "braid/ops.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "models.h"

namespace braid::zoo {

int train_ps(const PsRun& r) {
  using namespace distributed;
  const auto& w = world_info();
  BRAID_CHECK(r.servers >= 1 && r.servers < w.size, "braid-train: --ps ", r.servers, " servers of ", w.size,
              " ranks leave no worker; launch more ranks");
  const int workers = w.size - static_cast<int>(r.servers);
  BRAID_CHECK(r.batch_size % workers == 0, "braid-train: --batch-size ", r.batch_size, " must divide over the ",
              workers, " workers");
  manual_seed(r.seed);
  nn::ModulePtr model = make_model(r.model, 1, 10);
  model->to(r.device);
  const OptimizerFactory make_optimizer = [&](const std::vector<Tensor>& p) -> std::shared_ptr<optim::Optimizer> {
    if (r.optimizer == "adam") return std::make_shared<optim::Adam>(p, optim::AdamOptions{.lr = r.lr});
    return std::make_shared<optim::SGD>(
        p, optim::SGDOptions{.lr = r.lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  };
  // With dynamic batches the workers take micro-batches of batch_size / workers, in one order.
  const int64_t micro_batches = r.train_set->size() / (r.batch_size / workers) * r.epochs;
  Checkpoint resumed;  // Note [Parameter-server checkpoints]
  int64_t step = 0;
  if (!r.resume.empty()) {
    const std::string file = std::filesystem::is_directory(r.resume) ? r.resume + "/checkpoint.braid" : r.resume;
    resumed = load_checkpoint(file, r.device);
    BRAID_CHECK(resumed.integers.count("ps.servers") && resumed.integer("ps.servers") == r.servers &&
                    resumed.integer("ps.workers") == workers && resumed.integer("ps.dynamic") == (r.dynamic ? 1 : 0),
                "braid-train: --resume ", file, " is not a checkpoint of parameter-server training with ", r.servers,
                " server(s), ", workers, " workers and ", r.dynamic ? "dynamic batches" : "static shards",
                "; resume it with the layout it was written with");
    restore_state(resumed, "model.", *model);
    step = resumed.integer("step");
  }
  const int64_t stop_batches = r.stop_at_step > 0 ? std::min(micro_batches, r.stop_at_step * workers) : micro_batches;
  ParameterServer ps(model, make_optimizer, world(),
                     {.servers = static_cast<int>(r.servers), .staleness = static_cast<int>(r.staleness),
                      .dynamic_batches = r.dynamic ? stop_batches : 0, .first_batch = r.dynamic ? step * workers : 0});
  // After training, every rank learns the step and whether a signal stopped the run, the servers
  // write their state, then the first worker the checkpoint (Note [Parameter-server checkpoints]).
  const std::string out_dir = r.out;
  auto checkpoint = [&](int64_t at, bool signalled, const std::function<void(Checkpoint&)>& server_state,
                        const std::function<void()>& write_main) {
    Tensor info = tensor(std::vector<int64_t>{at, signalled ? 1 : 0}, {2}, Device::cpu());
    world()->broadcast(info, static_cast<int>(r.servers));
    const auto v = info.to_vector<int64_t>();
    const auto server_file = [&](int64_t n) { return detail::cat(out_dir, "/checkpoint.ps", w.rank, ".step", n, ".braid"); };
    if (server_state) {
      std::filesystem::create_directories(out_dir);
      Checkpoint mine;
      server_state(mine);
      mine.integers["step"] = v[0];
      save_checkpoint(server_file(v[0]), mine);
    }
    world()->barrier();
    if (write_main) write_main();
    world()->barrier();
    if (server_state) {
      const std::string keep = std::filesystem::path(server_file(v[0])).filename().string();
      const std::string mine = detail::cat("checkpoint.ps", w.rank, ".step");
      for (const auto& e : std::filesystem::directory_iterator(out_dir)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(mine, 0) == 0 && name != keep) std::filesystem::remove(e.path());
      }
    }
    return v[1] != 0;
  };
  ProcessGroupPtr crew = world()->split(ps.is_server() ? -1 : 0, w.rank);  // the workers
  if (ps.is_server()) {
    // data-parallel mode's schedule, over the server's updates: one per step when synchronous, one
    // per worker's push otherwise.
    const int64_t total = r.staleness < 0   ? (r.dynamic ? micro_batches : r.train_set->size() / r.batch_size * r.epochs * workers)
                          : r.dynamic       ? (micro_batches + workers - 1) / workers
                          : r.staleness == 0 ? r.train_set->size() / r.batch_size * r.epochs
                                             : r.train_set->size() / r.batch_size * r.epochs * workers;
    std::unique_ptr<optim::CosineWithWarmup> schedule;
    if (optim::Optimizer* opt = ps.server_optimizer())
      schedule = std::make_unique<optim::CosineWithWarmup>(*opt, std::min<int64_t>(200, total / 10), total, r.lr * 0.01);
    ps.on_server_step([&](optim::Optimizer&) {
      if (schedule) schedule->step();
    });
    if (!r.resume.empty() && schedule) {
      const std::string dir = std::filesystem::path(std::filesystem::is_directory(r.resume) ? r.resume + "/x" : r.resume)
                                  .parent_path().string();
      const std::string file = detail::cat(dir, "/checkpoint.ps", w.rank, ".step", step, ".braid");
      BRAID_CHECK(std::filesystem::exists(file), "braid-train: --resume: server rank ", w.rank, " has no ", file,
                  " (its optimizer state at step ", step, ")");
      const Checkpoint mine = load_checkpoint(file, r.device);
      restore_state(mine, "optim.", *ps.server_optimizer());
      restore_state(mine, "sched.", *schedule);
    }
    ps.serve();
    std::function<void(Checkpoint&)> state;
    if (schedule)
      state = [&](Checkpoint& c) { store_state(c, "optim.", *ps.server_optimizer()), store_state(c, "sched.", *schedule); };
    return checkpoint(0, false, state, nullptr) ? kRequeueExitCode : 0;
  }
  const int me = ps.worker_index();
  const bool lead = me == 0;
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(r.out, ec);
    BRAID_CHECK(!ec, "braid-train: cannot create the output folder '", r.out, "': ", ec.message());
    std::printf("braid-train: model %s (%lld parameters), parameter servers: %lld server%s and %d workers, %s%s, %s lr "
                "%g, batch %lld, %lld epochs\n",
                r.model.c_str(), static_cast<long long>(model->num_parameters()), static_cast<long long>(r.servers),
                r.servers == 1 ? "" : "s", workers,
                r.staleness == 0 ? "synchronous" : r.staleness < 0 ? "asynchronous"
                                                                    : ("staleness " + std::to_string(r.staleness)).c_str(),
                r.dynamic ? ", dynamic batches" : "",
                r.optimizer.c_str(), r.lr, static_cast<long long>(r.batch_size), static_cast<long long>(r.epochs));
    std::fflush(stdout);
  }
  data::DataLoaderOptions lo;
  lo.batch_size = r.batch_size / workers;
  lo.shuffle = true, lo.drop_last = true, lo.seed = r.seed;
  lo.transforms = {r.normalize};
  lo.num_shards = r.dynamic ? 1 : workers, lo.shard = r.dynamic ? 0 : me, lo.device = r.device;
  data::DataLoader train_loader(r.train_set, lo);
  data::DataLoaderOptions to = lo;
  to.batch_size = 500, to.shuffle = false, to.drop_last = false, to.num_shards = r.dynamic ? 1 : workers;
  data::DataLoader test_loader(r.test_set, to);
  auto over_crew = [&](std::vector<double> v) {
    if (r.dynamic) return v;  // with dynamic batches the first worker evaluates alone (train_ps.h)
    Tensor t = tensor(v, {static_cast<int64_t>(v.size())}, Device::cpu());
    crew->all_reduce(t);
    return t.to_vector<double>();
  };
  std::ofstream log;
  if (lead && r.resume.empty()) log.open(r.out + "/log.csv"), log << "step,epoch,train_loss,test_loss,test_accuracy,seconds\n";
  if (lead && !r.resume.empty()) log.open(r.out + "/log.csv", std::ios::app);
  if (!r.dynamic && !r.resume.empty()) restore_state(resumed, "loader.", train_loader);
  const auto start = std::chrono::steady_clock::now();
  int64_t mine = 0;  // this worker's batches; step: steps (rounds with dynamic batches)
  bool signalled = false;
  double final_accuracy = 0, loss_sum = 0, seen = 0;
  // The test set's loss and accuracy with the variables this worker holds, and the epoch's line.
  auto end_epoch = [&](int64_t epoch) {
    NoGradGuard no_grad;
    model->eval();
    double tl = 0, correct = 0, n = 0;
    data::Batch b;
    while (test_loader.next(b)) {
      if (b.input.size(0) == 0) continue;
      Tensor logits = model->forward(b.input);
      tl += nn::cross_entropy(logits, b.target, Tensor(), -100, "sum").item();
      correct += sum(eq(argmax(logits, 1), b.target)).item();
      n += static_cast<double>(b.input.size(0));
    }
    model->train();
    const auto t = over_crew({loss_sum, seen, tl, correct, n});
    loss_sum = seen = 0;
    final_accuracy = t[3] / t[4];
    if (!lead) return;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %lld: train loss %.4f | test loss %.4f acc %.4f (%.1f s)\n", static_cast<long long>(epoch + 1),
                t[0] / std::max(t[1], 1.0), t[2] / t[4], final_accuracy, secs);
    log << step << "," << epoch + 1 << "," << t[0] / std::max(t[1], 1.0) << "," << t[2] / t[4] << "," << final_accuracy
        << "," << secs << "\n";
    log.flush();
  };
  auto train_on = [&](const data::Batch& b) {
    model->zero_grad();
    Tensor loss = nn::cross_entropy(model->forward(b.input), b.target);
    loss.backward();
    if (w.rank == r.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(r.slow_ms));
    ++mine;
    loss_sum += loss.item() * static_cast<double>(b.input.size(0)), seen += static_cast<double>(b.input.size(0));
  };
  model->train();
  const int64_t per_epoch = train_loader.num_batches();
  std::unique_ptr<data::ProgressBar> bar;
  auto start_bar = [&](int64_t epoch, int64_t batches) {
    if (lead) bar = std::make_unique<data::ProgressBar>(detail::cat("epoch ", epoch + 1, "/", r.epochs), batches, "img/s");
  };
  if (r.dynamic) {
    // Note [Claimed batches]: batch b is batch b % per_epoch of epoch b / per_epoch; the first worker
    // evaluates whenever its next batch starts a later epoch, on the variables it then holds.
    int64_t epoch = step * workers / per_epoch;
    start_bar(epoch, per_epoch);
    data::Batch b;
    // A signal this worker caught asks server 0 to end the round (Note [Parameter-server checkpoints]).
    for (int64_t claimed; (claimed = ps.next_batch(!preemption_signal().empty())) >= 0;) {
      step = claimed / workers;
      if (claimed / per_epoch > epoch) {
        if (lead) bar->finish({{"loss", loss_sum / std::max(seen, 1.0)}}), end_epoch(epoch);
        start_bar(++epoch, per_epoch);
      }
      train_loader.seek(claimed / per_epoch, claimed % per_epoch);
      BRAID_CHECK(train_loader.next(b), "braid-train: batch ", claimed, " is past the training set's end");
      train_on(b);
      if (bar && mine % 20 == 0)
        bar->update(claimed % per_epoch + 1, (claimed % per_epoch + 1) * lo.batch_size, {{"loss", loss_sum / seen}});
    }
  }
  bool stopped = false;
  while (!r.dynamic && !stopped && train_loader.epoch() < r.epochs) {
    const int64_t epoch = train_loader.epoch();
    start_bar(epoch, train_loader.num_batches());
    data::Batch b;
    while (train_loader.next(b)) {
      train_on(b);
      ps.push_pull();
      ++step;
      if (bar && (b.index + 1) % 20 == 0) bar->update(b.index + 1, (b.index + 1) * r.batch_size, {{"loss", loss_sum / seen}});
      // Synchronous workers step together, so they can agree after every step; with staleness they
      // would wait for each other there, so they agree at the epoch's end instead.
      if (r.staleness == 0) signalled = preemption_requested(crew, step);
      if (signalled || step == r.stop_at_step) break;
    }
    stopped = signalled || step == r.stop_at_step;
    if (bar && stopped) bar->stop(train_loader.batch(), {{"loss", loss_sum / std::max(seen, 1.0)}});
    if (bar && !stopped) bar->finish({{"loss", loss_sum / std::max(seen, 1.0)}});
    if (!stopped) end_epoch(epoch);
    if (r.staleness != 0 && !stopped) stopped = signalled = preemption_requested(crew, step);
  }
  ps.finish();  // every worker now holds the servers' final variables
  if (r.dynamic) {
    step = (ps.handed_out() + workers - 1) / workers;
    stopped = ps.handed_out() < micro_batches, signalled = ps.handed_out() < stop_batches;
    if (lead) bar->finish({{"loss", loss_sum / std::max(seen, 1.0)}});
    if (lead && !stopped) end_epoch(r.epochs - 1);
  }
  const std::string ckpt_path = r.out + "/checkpoint.braid";
  const bool requeue = checkpoint(step, signalled, nullptr, !lead ? std::function<void()>() : [&] {
    Checkpoint ck;
    store_state(ck, "model.", *model);
    if (!r.dynamic) store_state(ck, "loader.", train_loader);
    ck.integers["step"] = step;
    ck.integers["ps.servers"] = r.servers, ck.integers["ps.workers"] = workers, ck.integers["ps.dynamic"] = r.dynamic;
    save_checkpoint(ckpt_path, ck);
  });
  if (requeue) {
    const std::string sig = preemption_signal();
    std::fprintf(stderr, "braid-train: rank %d: %s at step %lld; %s; exiting with code %d for the job script to requeue\n",
                 w.rank, sig.empty() ? "a peer rank was signalled" : (sig + " caught").c_str(),
                 static_cast<long long>(step), lead ? ("checkpoint written to " + ckpt_path).c_str() : "the first worker writes the checkpoint",
                 kRequeueExitCode);
    return kRequeueExitCode;
  }
  if (lead && stopped)
    std::printf("stopped after step %lld (--stop-at-step); checkpoint %s\n", static_cast<long long>(step), ckpt_path.c_str());
  const Traffic traffic = world()->traffic();
  if (lead)
    std::printf("communication: %.1f KB per step per worker pushed and pulled (point-to-point); final test accuracy "
                "%.4f\n",
                static_cast<double>(traffic.send.bytes + traffic.recv.bytes) / 1024.0 / static_cast<double>(std::max<int64_t>(mine, 1)),
                final_accuracy);
  return 0;
}

}  // namespace braid::zoo
