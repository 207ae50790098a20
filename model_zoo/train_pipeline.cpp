// braid-train --pipeline-stages K [--schedule NAME]: see train_pipeline.h. Metrics are the job's (reduced over the
// ranks, each replica counted once); the first replica's stages write one checkpoint per stage,
// and the first replica's pipeline writes its timeline (Chrome trace and Gantt chart) once.
#include "train_pipeline.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>

#include "braid/amp.h"
#include "braid/checkpoint.h"
#include "braid/data/progress.h"
#include "braid/distributed.h"
#include "braid/distributed/partition.h"
#include "braid/distributed/pipeline.h"
#include "braid/nn/loss.h"
#include "braid/ops.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "models.h"
#include "plot.h"

namespace braid::zoo {

namespace {

std::vector<double> sum_over_world(const std::vector<double>& values) {
  Tensor t = zeros({static_cast<int64_t>(values.size())}, kFloat64);
  for (size_t i = 0; i < values.size(); ++i) t.data<double>()[i] = values[i];
  distributed::world()->all_reduce(t, distributed::ReduceOp::Sum);
  return t.to_vector<double>();
}

Tensor cross_entropy_loss(const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); }

/// Stage s's checkpoint of the run that resume names (its folder or one of its stage files).
std::string stage_checkpoint(const std::string& resume, int s) {
  const std::string name = "checkpoint.stage" + std::to_string(s) + ".braid";
  if (std::filesystem::is_directory(resume)) return (std::filesystem::path(resume) / name).string();
  const std::filesystem::path p(resume);
  const std::string file = p.filename().string();
  BRAID_CHECK(file.rfind("checkpoint.stage", 0) == 0 && file.size() > 6 && file.ends_with(".braid"),
              "braid-train: --resume with --pipeline-stages takes the earlier run's output folder or one of its "
              "checkpoint.stage<s>.braid files, got '", resume, "'");
  return (p.parent_path() / name).string();
}

// Note [Resuming with another stage count]
// Each stage's checkpoint holds its layers' weights under the whole model's names (a stage is a
// slice of the model's Sequential that keeps the children's names), its optimizer's state numbered
// by the stage's own parameters, and the same schedule, loader position and step as every other
// stage. A run resumed with K' != K stages therefore: loads all K files; restores each into its
// slice of the whole model under the old cuts (the slices share the model's layers, so the whole
// model ends up with every weight); restores each old stage's optimizer state into a temporary
// optimizer over that slice and hands every parameter's state, found by the tensor itself, to the
// new stage's optimizer under its new number; and takes the schedule, loader position, random
// state and step from stage 0. The new cuts come from the partitioner, as in a fresh run.
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;

void restore_repartitioned(const std::vector<Checkpoint>& old, nn::Sequential& model, const MakeOptimizer& make_opt,
                           nn::Sequential& stage, optim::Optimizer* opt) {
  distributed::PartitionPlan old_plan;
  old_plan.first_layer.push_back(0);
  for (int64_t c : old[0].tensor("pipeline.cuts").to_vector<int64_t>()) old_plan.first_layer.push_back(static_cast<int>(c));
  std::map<const void*, optim::ParamState> states;  // by the parameter's TensorImpl
  for (size_t s = 0; s < old.size(); ++s) {
    auto slice = distributed::stage_layers(model, old_plan, static_cast<int>(s));
    restore_state(old[s], "model.", *slice);
    const std::vector<Tensor> params = slice->parameters();
    if (params.empty() || !opt) continue;
    std::unique_ptr<optim::Optimizer> previous = make_opt(params);
    restore_state(old[s], "optim.", *previous);
    for (const Tensor& p : params)
      if (const optim::ParamState* st = previous->state(p)) states[p.impl_ptr().get()] = *st;
  }
  if (!opt) return;
  optim::OptimizerState st = opt->state_dict();  // this stage's groups and options, no state yet
  const std::vector<Tensor> params = stage.parameters();
  for (size_t j = 0; j < params.size(); ++j) {
    auto it = states.find(params[j].impl_ptr().get());
    if (it == states.end()) continue;
    const std::string key = "state." + std::to_string(j) + ".";
    for (const auto& [name, t] : it->second.tensors) st.tensors[key + name] = t;
    for (const auto& [name, v] : it->second.scalars) st.scalars[key + name] = v;
  }
  opt->load_state_dict(st);
}

}  // namespace

int train_pipeline(const PipelineRun& r) {
  using namespace distributed;
  const auto& w = world_info();
  const bool lead = w.rank == 0;
  const int k = static_cast<int>(r.stages);
  Grid grid = make_grid(k);
  const int d = grid.data->size();
  BRAID_CHECK_T(NotImplementedError, d == 1 || r.schedule == "1f1b" || r.schedule == "gpipe",
                "braid-train: --schedule ", r.schedule,
                " does not run with data parallelism yet; launch as many ranks as --pipeline-stages (", k,
                "), or use 1f1b or gpipe");
  BRAID_CHECK(r.batch_size % (static_cast<int64_t>(d) * r.micro_batches) == 0, "braid-train: --batch-size ",
              r.batch_size, " must divide into ", d, " replicas x ", r.micro_batches, " micro-batches");
  // The schedule first: a wrong name or shape is an error before anything is loaded.
  const int v = r.schedule == "interleaved" ? static_cast<int>(r.chunks) : 1;
  const int pieces = k * v;  // virtual stages: chunk c of stage s is piece c * k + s
  const PipeSchedule sched = make_schedule(r.schedule, k, static_cast<int>(r.micro_batches), v);
  manual_seed(r.seed);
  auto seq = std::dynamic_pointer_cast<nn::Sequential>(make_model(r.model, 1, 10));
  BRAID_CHECK(seq != nullptr, "braid-train: --pipeline-stages needs a Sequential model");
  BRAID_CHECK(static_cast<int>(seq->size()) >= pieces, "braid-train: model ", r.model, " has ", seq->size(),
              " layers, fewer than the ", pieces, " pieces of ", k, " stages x ", v, " chunks");

  // The plan: rank 0 profiles one micro-batch on a copy (profiling runs BatchNorm in training
  // mode, which would move the real model's statistics) and every rank takes its cuts.
  Tensor cuts = zeros({pieces - 1}, kInt64);
  const int64_t micro = r.batch_size / d / r.micro_batches;
  std::optional<Checkpoint> resumed;  // this stage's file, resuming with the earlier run's cuts
  std::vector<Checkpoint> merged;     // every stage's file, resuming with another stage count
  int saved_k = k;
  if (!r.resume.empty()) {
    const Checkpoint first = load_checkpoint(stage_checkpoint(r.resume, 0));
    saved_k = static_cast<int>(first.integer("pipeline.stages"));
    const int saved_v =
        first.integers.count("pipeline.chunks") ? static_cast<int>(first.integer("pipeline.chunks")) : 1;
    BRAID_CHECK(saved_v == v && (v == 1 || saved_k == k), "braid-train: ", first.source, " comes from a run of ",
                saved_k, " stages x ", saved_v, " chunks; this run has ", k, " x ", v,
                " (an interleaved run resumes with the same --pipeline-stages and --chunks)");
  }
  if (saved_k != k) {
    // Note [Resuming with another stage count]: every rank reads every stage's file.
    for (int s = 0; s < saved_k; ++s) {
      merged.push_back(load_checkpoint(stage_checkpoint(r.resume, s)));
      BRAID_CHECK(merged.back().integer("pipeline.stage") == s && merged.back().integer("pipeline.stages") == saved_k,
                  "braid-train: ", merged.back().source, " is not stage ", s, " of the ", saved_k,
                  "-stage run that stage 0's file describes");
      BRAID_CHECK(merged.back().integer("step") == merged[0].integer("step"), "braid-train: ", merged.back().source,
                  " is at step ", merged.back().integer("step"), " but ", merged[0].source, " at step ",
                  merged[0].integer("step"), "; the stage files come from different moments");
    }
    if (lead)
      std::printf("braid-train: resuming the %d-stage run of %s at step %lld with %d stages: its weights and "
                  "optimizer state are merged and cut again\n", saved_k, r.resume.c_str(),
                  static_cast<long long>(merged[0].integer("step")), k);
  } else if (!r.resume.empty()) {
    // Every rank reads its stage's file; the cuts must be the earlier run's, since the weights
    // were split by them.
    resumed = load_checkpoint(stage_checkpoint(r.resume, grid.stage));
    BRAID_CHECK(resumed->integer("pipeline.stages") == k && resumed->integer("pipeline.stage") == grid.stage,
                "braid-train: ", resumed->source, " holds stage ", resumed->integer("pipeline.stage"), " of a ",
                resumed->integer("pipeline.stages"), "-stage pipeline; this run has ", k,
                " stages (--pipeline-stages must match the run it resumes)");
    const Tensor& saved = resumed->tensor("pipeline.cuts");
    BRAID_CHECK(saved.numel() == pieces - 1, "braid-train: ", resumed->source, " has ", saved.numel(), " cuts for ",
                pieces, " pieces");
    cuts = saved.clone();
    if (lead) {
      std::printf("braid-train: resuming from %s at step %lld (epoch %lld, batch %lld) with its cuts:",
                  resumed->source.c_str(), static_cast<long long>(resumed->integer("step")),
                  static_cast<long long>(resumed->integer("loader.epoch") + 1),
                  static_cast<long long>(resumed->integer("loader.batch")));
      for (int64_t c : cuts.to_vector<int64_t>()) std::printf(" %lld", static_cast<long long>(c));
      std::printf("\n");
    }
  }
  if (!resumed && lead) {  // a fresh run, or one resumed with another stage count
    auto copy = std::dynamic_pointer_cast<nn::Sequential>(make_model(r.model, 1, 10));
    Generator g(r.seed + 17);
    const auto profile = profile_layers(*copy, randn({micro, 1, 28, 28}, kFloat32, &g));
    PartitionOptions o;
    o.micro_batches_in_flight = k;  // 1F1B keeps at most K micro-batches alive on stage 0
    const PartitionPlan plan = partition(profile, pieces, o);
    std::printf("braid-train: pipeline of %d stages x %d replicas, %s, %lld micro-batches of %lld; plan%s:\n%s\n", k, d,
                sched.name.c_str(), static_cast<long long>(r.micro_batches), static_cast<long long>(micro),
                v > 1 ? " (stage c*K+s below is chunk c of rank s)" : "", plan.str(profile).c_str());
    for (int s = 1; s < pieces; ++s) cuts.data<int64_t>()[s - 1] = plan.first_layer[static_cast<size_t>(s)];
  }
  if (!resumed) world()->broadcast(cuts, 0);
  manual_seed(r.seed + 1);  // every rank's generator in the same state, whoever profiled
  PartitionPlan plan;
  plan.first_layer.push_back(0);
  for (int64_t c : cuts.to_vector<int64_t>()) plan.first_layer.push_back(static_cast<int>(c));
  // With chunks, `stage` holds every chunk's layers under the model's names (for the optimizer,
  // data parallelism and the checkpoint) and the pipeline runs the chunks, which share them.
  std::vector<std::shared_ptr<nn::Sequential>> chunk_modules;
  for (int c = 0; c < v; ++c) chunk_modules.push_back(stage_layers(*seq, plan, c * k + grid.stage));
  auto stage = chunk_modules[0];
  if (v > 1) {
    stage = std::make_shared<nn::Sequential>();
    for (const auto& chunk : chunk_modules)
      for (const auto& [name, child] : chunk->named_children()) stage->add(child, name);
  }
  stage->to(r.device);
  const MakeOptimizer make_opt = [&](const std::vector<Tensor>& params) -> std::unique_ptr<optim::Optimizer> {
    if (r.optimizer == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = r.lr});
    return std::make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = r.lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  };
  std::unique_ptr<optim::Optimizer> opt;
  // A stage of parameter-free layers (activations, pooling) has nothing to update.
  if (!stage->parameters().empty()) opt = make_opt(stage->parameters());
  if (!merged.empty()) restore_repartitioned(merged, *seq, make_opt, *stage, opt.get());  // before DDP's broadcast

  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedDataParallel> sdp;  // --zero-stage 1 or 2 across the replicas
  PipelineOptions po;
  if (r.zero_stage > 0) {
    BRAID_CHECK(r.zero_stage <= 2, "braid-train: --zero-stage 3 does not run with --pipeline-stages (it frees the "
                "parameters that a stage's micro-batches accumulate into); use --zero-stage 1 or 2");
    BRAID_CHECK_T(NotImplementedError, r.schedule == "1f1b" || r.schedule == "gpipe", "braid-train: --zero-stage with ",
                  "--schedule ", r.schedule, " is not supported yet; use 1f1b or gpipe");
    BRAID_CHECK(opt != nullptr, "braid-train: stage ", grid.stage, " holds no parameters, so --zero-stage has nothing ",
                "to shard there; cut the model differently or run without --zero-stage");
    // The stage as it stands (fresh, or restored with another stage count) moves into the shards.
    Checkpoint start;
    store_state(start, "model.", *stage);
    store_state(start, "optim.", *opt);
    opt.reset();
    sdp = std::make_unique<ShardedDataParallel>(
        stage, [&](const std::vector<Tensor>& params) { return std::shared_ptr<optim::Optimizer>(make_opt(params)); },
        grid.data, ShardedOptions{.stage = static_cast<int>(r.zero_stage)});
    sdp->load_full(start);
    po.sharded = sdp.get();
  } else if (d > 1) {
    ddp = std::make_unique<DistributedDataParallel>(stage, grid.data);
    po.data_parallel = ddp.get();
  }
  optim::Optimizer* step_opt = sdp ? &sdp->optimizer() : opt.get();
  PipelineStage pipe(chunk_modules[0], grid.pipeline, po);
  for (int c = 1; c < v; ++c) pipe.add_chunk(chunk_modules[static_cast<size_t>(c)]);

  data::DataLoaderOptions train_opts;
  train_opts.batch_size = r.batch_size / d;
  train_opts.shuffle = true;
  train_opts.drop_last = true;
  train_opts.seed = r.seed;
  train_opts.transforms = {r.normalize};
  train_opts.num_shards = d;
  train_opts.shard = grid.replica;
  train_opts.device = r.device;
  data::DataLoader train_loader(r.train_set, train_opts);
  data::DataLoaderOptions test_opts;
  test_opts.batch_size = 500;
  test_opts.transforms = {r.normalize};
  test_opts.num_shards = d;
  test_opts.shard = grid.replica;
  test_opts.device = r.device;
  data::DataLoader test_loader(r.test_set, test_opts);

  const int64_t steps_per_epoch = train_loader.num_batches(), total = steps_per_epoch * r.epochs;
  std::unique_ptr<optim::CosineWithWarmup> schedule;
  if (step_opt)
    schedule = std::make_unique<optim::CosineWithWarmup>(*step_opt, std::min<int64_t>(200, total / 10), total, r.lr * 0.01);
  int64_t step = 0;
  if (resumed) {
    if (sdp) {
      sdp->load_full(*resumed);
    } else {
      restore_state(*resumed, "model.", *stage);
      if (opt) restore_state(*resumed, "optim.", *opt);
    }
    if (schedule) restore_state(*resumed, "sched.", *schedule);
    restore_state(*resumed, "rng.", default_generator());
    restore_state(*resumed, "loader.", train_loader);
    step = resumed->integer("step");
  } else if (!merged.empty()) {
    // The schedule, the loader's position and the step are every stage's alike; stage 0's are taken.
    if (schedule) restore_state(merged[0], "sched.", *schedule);
    restore_state(merged[0], "rng.", default_generator());
    restore_state(merged[0], "loader.", train_loader);
    step = merged[0].integer("step");
  }
  std::ofstream log;
  const bool continuing = resumed || !merged.empty();
  if (lead) log.open(r.out + "/log.csv", continuing ? std::ios::app : std::ios::trunc);
  if (lead && !continuing) log << "step,epoch,train_loss,test_loss,test_accuracy,lr\n";
  Series train_loss{"train loss", {}, {}, "#1f77b4"}, test_loss{"test loss", {}, {}, "#d62728"};
  Series test_acc{"test accuracy", {}, {}, "#d62728"};
  double final_accuracy = 0;
  // The first replica's stages write one file each (all at the same step). With --zero-stage every
  // replica writes its shard of the stage and the first joins them (Note [Checkpoints of a sharded
  // run] in replicas.cpp), so the file is the same either way.
  const std::string stage_file = r.out + "/checkpoint.stage" + std::to_string(grid.stage) + ".braid";
  auto write_checkpoint = [&] {
    Checkpoint ck;
    if (sdp) {
      save_sharded_checkpoint(stage_file + ".shards", sdp->state_shard(), grid.data);
      if (grid.replica != 0) return;
      ck = ShardedDataParallel::unshard(load_sharded_checkpoint(stage_file + ".shards"));
    } else {
      if (grid.replica != 0) return;
      store_state(ck, "model.", *stage);
      if (opt) store_state(ck, "optim.", *opt);
    }
    if (schedule) store_state(ck, "sched.", *schedule);
    store_state(ck, "rng.", default_generator());
    store_state(ck, "loader.", train_loader);
    ck.tensors["pipeline.cuts"] = cuts;
    ck.integers["pipeline.stages"] = k;
    ck.integers["pipeline.chunks"] = v;
    ck.integers["pipeline.stage"] = grid.stage;
    ck.integers["step"] = step;
    save_checkpoint(stage_file, ck);
  };
  stage->train();  // preemption signals are caught from the start of run() (train.cpp)
  const int64_t stop_epoch = r.stop_after > 0 ? train_loader.epoch() + r.stop_after : r.epochs;
  while (train_loader.epoch() < std::min(r.epochs, stop_epoch)) {
    const int64_t epoch = train_loader.epoch();
    std::unique_ptr<data::ProgressBar> bar;
    if (lead) bar = std::make_unique<data::ProgressBar>("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(r.epochs),
                                                        steps_per_epoch, "img/s");
    double local = 0, job_loss = 0, job_seen = 0;
    int64_t window = 0;
    data::Batch b;
    while (train_loader.next(b)) {
      if (sdp) sdp->zero_grad();
      else if (opt) opt->zero_grad();
      double l;
      {
        // Forward passes run in bfloat16 products; the schedule's backward passes stay float32.
        autocast amp(kBFloat16, r.amp == "bf16");
        l = pipe.train_step(sched, b.input, b.target, cross_entropy_loss);
      }
      if (sdp) sdp->step();
      else if (opt) opt->step();
      if (schedule) schedule->step();
      ++step;
      local += l;
      ++window;
      if (step == 10) {  // a step after warm-up, drawn once
        const PipeTimeline t = pipe.gather_timeline();
        if (lead) {
          t.write_chrome_trace(r.out + "/pipeline_trace.json");
          t.write_gantt_svg(r.out + "/pipeline_gantt.svg", "braid-train " + r.model + ", " + sched.name +
                                                               ", K=" + std::to_string(k) +
                                                               ", M=" + std::to_string(r.micro_batches));
        }
      }
      if (window == 20 || b.index + 1 == steps_per_epoch) {
        // Every rank of a replica holds the same loss: count each replica once.
        const auto tot = sum_over_world({local * static_cast<double>(b.input.size(0)) / k,
                                         static_cast<double>(window * b.input.size(0)) / k});
        job_loss += tot[0];
        job_seen += tot[1];
        train_loss.x.push_back(static_cast<double>(step) / static_cast<double>(steps_per_epoch));
        train_loss.y.push_back(tot[0] / tot[1]);
        local = 0;
        window = 0;
        if (bar) bar->update(b.index + 1, static_cast<int64_t>(job_seen), {{"loss", job_loss / job_seen}});
      }
      const bool stop_here = r.stop_at_step > 0 && step == r.stop_at_step;
      if (preemption_requested(step) || stop_here) {  // Note [Preemption]: every rank stops after the same step
        if (bar) bar->stop(train_loader.batch(), {{"loss", job_loss / std::max(job_seen, 1.0)}});
        write_checkpoint();
        world()->barrier();  // no rank exits before every stage's file is written
        const std::string sig = preemption_signal();
        if (stop_here && sig.empty()) {
          if (lead)
            std::printf("stopped after step %lld (--stop-at-step; epoch %lld, batch %lld of %lld); stage checkpoints "
                        "in %s\n", static_cast<long long>(step), static_cast<long long>(epoch + 1),
                        static_cast<long long>(train_loader.batch()), static_cast<long long>(steps_per_epoch),
                        r.out.c_str());
          return 0;
        }
        std::fprintf(stderr, "braid-train: rank %d (stage %d): %s at step %lld (epoch %lld, batch %lld of %lld); stage "
                     "checkpoints in %s; exiting with code %d for the job script to requeue\n", w.rank, grid.stage,
                     sig.empty() ? "a peer rank was signalled" : (sig + " caught").c_str(), static_cast<long long>(step),
                     static_cast<long long>(epoch + 1), static_cast<long long>(train_loader.batch()),
                     static_cast<long long>(steps_per_epoch), r.out.c_str(), kRequeueExitCode);
        return kRequeueExitCode;
      }
    }
    if (bar) bar->finish({{"loss", job_loss / std::max(job_seen, 1.0)}});
    // Evaluation: each replica's last stage scores its shard of the test set.
    stage->eval();
    double loss = 0, correct = 0, seen = 0;
    while (test_loader.next(b)) {
      if (b.input.size(0) == 0) continue;
      Tensor out = pipe.forward(b.input);
      if (!out.defined()) continue;
      loss += nn::cross_entropy(out, b.target, Tensor(), -100, "sum").item();
      correct += sum(eq(argmax(out, 1), b.target)).item();
      seen += static_cast<double>(b.input.size(0));
    }
    stage->train();
    const auto ev = sum_over_world({loss, correct, seen});
    final_accuracy = ev[1] / ev[2];
    write_checkpoint();
    if (saved_k > k) {
      // A run resumed with fewer stages leaves the earlier run's last stage files behind; once every
      // stage has written its new file, they go (before that they were part of the only checkpoint).
      world()->barrier();
      if (lead)
        for (int s = k; s < saved_k; ++s)
          std::filesystem::remove(r.out + "/checkpoint.stage" + std::to_string(s) + ".braid");
    }
    if (!lead) continue;
    std::printf("epoch %lld: train loss %.4f | test loss %.4f acc %.4f\n", static_cast<long long>(epoch + 1),
                job_loss / job_seen, ev[0] / ev[2], final_accuracy);
    log << step << "," << epoch + 1 << "," << job_loss / job_seen << "," << ev[0] / ev[2] << "," << final_accuracy << ","
        << (schedule ? schedule->get_last_lr()[0] : r.lr) << "\n";
    log.flush();
    test_loss.x.push_back(static_cast<double>(epoch + 1)), test_loss.y.push_back(ev[0] / ev[2]);
    test_acc.x.push_back(static_cast<double>(epoch + 1)), test_acc.y.push_back(final_accuracy);
  }
  if (!lead) return 0;
  write_svg_chart(r.out + "/curves.svg", "braid-train: " + r.model + ", " + std::to_string(k) + "-stage pipeline",
                  {{"cross-entropy", {train_loss, test_loss}}, {"accuracy", {test_acc}}});
  std::printf("final test accuracy %.4f; per-stage checkpoints %s/checkpoint.stage<s>.braid, timeline %s/pipeline_gantt.svg\n",
              final_accuracy, r.out.c_str(), r.out.c_str());
  return 0;
}

}  // namespace braid::zoo
