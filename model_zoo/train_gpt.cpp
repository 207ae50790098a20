// braid-train --model gpt: see train_gpt.h. Every rank loads the corpus and builds the whole model
// from the same seed, splits it over its tensor-parallel group and keeps its pipeline stage's
// blocks, so every grid starts from the one-process run's weights. Metrics count each replica once
// (by its stage-0, tensor-rank-0 rank, or its last stage's for the validation loss).
#include "train_gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "braid/checkpoint.h"
#include "braid/data/progress.h"
#include "braid/distributed.h"
#include "braid/distributed/partition.h"
#include "braid/distributed/pipeline.h"
#include "braid/ops.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "plot.h"

namespace braid::zoo {

namespace {

std::vector<double> sum_over_world(const std::vector<double>& values) {
  Tensor t = zeros({static_cast<int64_t>(values.size())}, kFloat64, Device::cpu());
  for (size_t i = 0; i < values.size(); ++i) t.data<double>()[i] = values[i];
  distributed::world()->all_reduce(t, distributed::ReduceOp::Sum);
  return t.to_vector<double>();
}

std::shared_ptr<data::TensorDataset> first_n(std::shared_ptr<data::TensorDataset> d, int64_t n) {
  if (n <= 0 || n >= d->size()) return d;
  return std::make_shared<data::TensorDataset>(d->inputs().narrow(0, 0, n), d->targets().narrow(0, 0, n));
}

}  // namespace

int train_gpt(const GptRun& r) {
  using namespace distributed;
  const auto& w = world_info();
  const bool lead = w.rank == 0;
  const int T = static_cast<int>(r.tensor_parallel), P = static_cast<int>(r.pipeline_stages);
  BRAID_CHECK(T >= 1 && P >= 1 && w.size % (T * P) == 0, "braid-train: ", w.size, " ranks do not form a grid of ", P,
              " pipeline stages x ", T, " tensor shards (--pipeline-stages x --tensor-parallel must divide the ",
              "number of ranks)");
  BRAID_CHECK(r.schedule == "1f1b" || r.schedule == "gpipe", "braid-train: --model gpt runs the 1f1b or gpipe ",
              "schedule, not ", r.schedule);
  BRAID_CHECK(r.zero_stage >= 0 && r.zero_stage <= 3, "braid-train: --zero-stage must be 0 to 3, got ", r.zero_stage);
  BRAID_CHECK(r.zero_stage < 3 || P == 1, "braid-train: --zero-stage 3 does not run with --pipeline-stages (it ",
              "frees the parameters that a pipeline's micro-batches accumulate into); use --zero-stage 1 or 2");
  const Grid g = make_grid(GridShape{.data = 0, .pipeline = P, .tensor = T});
  const int D = g.shape.data;
  const int64_t M = P > 1 ? r.micro_batches : 1;
  BRAID_CHECK(r.batch_size % (D * M) == 0, "braid-train: --batch-size ", r.batch_size, " (sequences) must divide ",
              "into ", D, " replicas x ", M, " micro-batches");

  const CharCorpus corpus = load_movie_review_corpus(r.data, r.config.context);
  GptConfig c = r.config;
  const auto alphabet = static_cast<int64_t>(corpus.alphabet.size());
  if (c.vocab == 0) c.vocab = (alphabet + 127) / 128 * 128;  // a width every power-of-two T up to 128 divides
  BRAID_CHECK(c.vocab >= alphabet, "braid-train: --vocab ", c.vocab, " is smaller than the corpus's ", alphabet,
              " distinct bytes");
  BRAID_CHECK(c.vocab % T == 0 && c.heads % T == 0, "braid-train: --tensor-parallel ", T, " must divide the vocabulary (",
              c.vocab, ") and the heads (", c.heads, ")");
  auto train_set = first_n(corpus.train, r.limit);
  auto val_set = first_n(corpus.validation, r.limit > 0 ? std::max<int64_t>(r.limit / 8, r.batch_size) : 0);

  manual_seed(r.seed);
  auto model = gpt(c);
  model->to(r.dtype);
  model->to(r.device);
  const int64_t parameters = model->num_parameters();
  if (T > 1) parallelize_module(*model, g.tensor, gpt_tensor_parallel_plan(c));
  // Stage s holds the children [s C / P, (s + 1) C / P) under the model's names.
  const int C = static_cast<int>(model->size());
  BRAID_CHECK(C >= P, "braid-train: the model has ", C, " pieces (embeddings, ", c.layers, " blocks, ln_f, lm_head), ",
              "fewer than the ", P, " stages");
  auto stage = slice_layers(*model, g.stage * C / P, (g.stage + 1) * C / P);
  model.reset();

  const OptimizerFactory adam = [&](const std::vector<Tensor>& params) {
    return std::make_shared<optim::Adam>(params, optim::AdamOptions{.lr = r.lr, .betas = {0.9, 0.95}});
  };
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedDataParallel> sdp;
  std::shared_ptr<optim::Optimizer> own_opt;
  PipelineOptions po;
  if (r.zero_stage == 0) {
    ddp = std::make_unique<DistributedDataParallel>(stage, g.data, DataParallelOptions{.bucket_cap_mb = r.bucket_mb});
    po.data_parallel = ddp.get();
    own_opt = adam(stage->parameters());
  } else {
    sdp = std::make_unique<ShardedDataParallel>(
        stage, adam, g.data, ShardedOptions{.stage = static_cast<int>(r.zero_stage), .bucket_cap_mb = r.bucket_mb});
    po.sharded = sdp.get();
  }
  optim::Optimizer& opt = sdp ? sdp->optimizer() : *own_opt;
  std::unique_ptr<PipelineStage> pipe;
  if (P > 1) pipe = std::make_unique<PipelineStage>(stage, g.pipeline, po);
  const PipeSchedule schedule = P > 1 ? make_schedule(r.schedule, P, static_cast<int>(M)) : PipeSchedule{};
  const ProcessGroupPtr tp = g.tensor;
  const PipeLoss loss_of = [tp](const Tensor& out, const Tensor& y) { return gpt_loss(out, y, tp); };

  // Replica d takes shard d of every global batch (Note [Sharding rule] in braid/data/loader.h).
  data::DataLoaderOptions lo;
  lo.batch_size = r.batch_size / D;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.seed = r.seed;
  lo.num_shards = D;
  lo.shard = g.replica;
  lo.device = r.device;
  data::DataLoader train_loader(train_set, lo);
  data::DataLoaderOptions vo = lo;
  vo.shuffle = false;
  vo.batch_size = std::min<int64_t>(32, std::max<int64_t>(1, val_set->size() / D));
  data::DataLoader val_loader(val_set, vo);
  const int64_t steps_per_epoch = train_loader.num_batches(), total = steps_per_epoch * r.epochs;
  BRAID_CHECK(steps_per_epoch > 0, "braid-train: ", train_set->size(), " training sequences make no global batch of ",
              r.batch_size);
  optim::CosineWithWarmup lr_schedule(opt, std::min<int64_t>(100, total / 10), total, r.lr * 0.1);
  const int64_t tokens_per_step = r.batch_size * c.context;

  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(r.out, ec);
    BRAID_CHECK(!ec, "braid-train: cannot create the output folder '", r.out, "': ", ec.message());
    std::printf("braid-train: model gpt (%lld parameters: %lld layers, %lld heads, embed %lld, context %lld, vocab "
                "%lld), %s, Adam lr %g, batch %lld sequences (%lld tokens), %lld epochs, %lld train / %lld validation "
                "sequences of %s\n",
                static_cast<long long>(parameters), static_cast<long long>(c.layers), static_cast<long long>(c.heads),
                static_cast<long long>(c.embed), static_cast<long long>(c.context), static_cast<long long>(c.vocab),
                dtype_name(r.dtype).c_str(), r.lr, static_cast<long long>(r.batch_size), static_cast<long long>(tokens_per_step),
                static_cast<long long>(r.epochs), static_cast<long long>(train_set->size()),
                static_cast<long long>(val_set->size()), r.data.c_str());
    std::printf("braid-train: grid of %d ranks = %d data-parallel replicas (%s) x %d pipeline stages (%s, %lld "
                "micro-batches) x %d tensor-parallel shards, on %s\n",
                w.size, D, r.zero_stage ? ("ZeRO stage " + std::to_string(r.zero_stage)).c_str() : "DDP", P,
                r.schedule.c_str(), static_cast<long long>(M), T, r.device.str().c_str());
    std::fflush(stdout);
  }

  // The validation loss per token, each replica's shard counted once.
  auto validate = [&]() {
    NoGradGuard no_grad;
    stage->eval();
    double sum = 0, tokens = 0;
    data::Batch b;
    while (val_loader.next(b)) {
      Tensor out = pipe ? pipe->forward(b.input) : stage->forward(b.input);
      if (g.stage != P - 1) continue;
      const double l = gpt_loss(out, b.target, tp).item();  // every shard joins the vocabulary's reduction
      if (g.tensor_rank == 0) sum += l * static_cast<double>(b.target.numel()), tokens += static_cast<double>(b.target.numel());
    }
    stage->train();
    const auto t = sum_over_world({sum, tokens});
    return t[0] / std::max(t[1], 1.0);
  };

  std::ofstream log;
  if (lead) log.open(r.out + "/log.csv", std::ios::trunc), log << "step,epoch,train_loss,validation_loss,lr\n";
  Series train_curve{"train loss", {}, {}, "#1f77b4"}, val_curve{"validation loss", {}, {}, "#d62728"};
  const bool counts = g.stage == 0 && g.tensor_rank == 0;  // train_step returns the loss on every stage
  int64_t step = 0;
  double val_loss = 0;
  stage->train();
  for (int64_t epoch = 0; epoch < r.epochs; ++epoch) {
    std::unique_ptr<data::ProgressBar> bar;
    if (lead) bar = std::make_unique<data::ProgressBar>(detail::cat("epoch ", epoch + 1, "/", r.epochs), steps_per_epoch,
                                                        "tok/s");
    double window_loss = 0, epoch_loss = 0;
    int64_t window = 0;
    data::Batch b;
    while (train_loader.next(b)) {
      if (sdp) sdp->zero_grad();
      else opt.zero_grad();
      double l = 0;
      if (pipe) {
        l = pipe->train_step(schedule, b.input, b.target, loss_of);
      } else {
        Tensor loss = loss_of(ddp ? (*ddp)(b.input) : (*sdp)(b.input), b.target);
        loss.backward();
        l = loss.item();
      }
      if (sdp) sdp->step();
      else opt.step();
      lr_schedule.step();
      ++step, ++window;
      window_loss += counts ? l : 0.0;
      if (window == 10 || b.index + 1 == steps_per_epoch) {
        const double mean = sum_over_world({window_loss})[0] / static_cast<double>(window * D);
        epoch_loss += mean * static_cast<double>(window);
        train_curve.x.push_back(static_cast<double>(step) / static_cast<double>(steps_per_epoch));
        train_curve.y.push_back(mean);
        if (bar) bar->update(b.index + 1, (b.index + 1) * tokens_per_step, {{"loss", mean}});
        if (lead) log << step << "," << epoch + 1 << "," << mean << ",," << lr_schedule.get_last_lr()[0] << "\n";
        window_loss = 0, window = 0;
      }
    }
    const double train_loss = epoch_loss / static_cast<double>(steps_per_epoch);
    if (bar) bar->finish({{"loss", train_loss}});
    val_loss = validate();
    if (!lead) continue;
    std::printf("epoch %lld: train loss %.4f | validation loss %.4f (%.3f bits per character)\n",
                static_cast<long long>(epoch + 1), train_loss, val_loss, val_loss / std::log(2.0));
    log << step << "," << epoch + 1 << "," << train_loss << "," << val_loss << "," << lr_schedule.get_last_lr()[0] << "\n";
    log.flush();
    val_curve.x.push_back(static_cast<double>(epoch + 1)), val_curve.y.push_back(val_loss);
  }

  // A sample: every replica draws the same characters (one seed); the last stage picks each one
  // from the gathered logits and the pipeline passes it back to the first.
  std::string sample;
  if (r.sample > 0) {
    NoGradGuard no_grad;
    stage->eval();
    std::mt19937_64 rng(r.seed + 1);
    std::vector<int64_t> ids{static_cast<int64_t>(std::find(corpus.alphabet.begin(), corpus.alphabet.end(), U'\n') -
                                                  corpus.alphabet.begin())};
    for (int64_t i = 0; i < r.sample; ++i) {
      const int64_t L = std::min<int64_t>(static_cast<int64_t>(ids.size()), c.context);
      Tensor x = tensor(std::vector<int64_t>(ids.end() - L, ids.end()), {1, L}, r.device);
      Tensor out = pipe ? pipe->forward(x) : stage->forward(x);
      Tensor next = zeros({1}, kInt64, r.device);
      if (g.stage == P - 1) {
        Tensor logits = out.narrow(1, L - 1, 1).reshape({1, -1});
        if (T > 1) logits = gather_from_tp(logits, tp);
        // Temperature 0.8 over the corpus's characters (the padding ids never occur).
        const auto p = softmax(logits.narrow(1, 0, alphabet).to(kFloat64) * 1.25, -1).to(Device::cpu()).to_vector<double>();
        std::discrete_distribution<int64_t> pick(p.begin(), p.end());
        next.fill_(static_cast<double>(pick(rng)));
      }
      if (P > 1) g.pipeline->broadcast(next, P - 1);
      ids.push_back(static_cast<int64_t>(next.item()));
    }
    stage->train();
    sample = corpus.decode(std::vector<int64_t>(ids.begin() + 1, ids.end()));
  }

  // Each stage's whole parameters (ZeRO 3 gathers them back as it ends; the tensor-parallel shards
  // are gathered), written by replica 0's tensor rank 0.
  pipe.reset();
  sdp.reset();
  const nn::StateDict state = T > 1 ? gather_state_dict(*stage) : stage->state_dict();
  const std::string stage_file = detail::cat(r.out, "/model.stage", g.stage, ".braid");
  if (g.replica == 0 && g.tensor_rank == 0) {
    Checkpoint ck;
    for (const auto& [name, t] : state) ck.tensors["model." + name] = t;
    ck.integers["pipeline.stage"] = g.stage;
    ck.integers["pipeline.stages"] = P;
    ck.integers["step"] = step;
    save_checkpoint(stage_file, ck);
  }
  world()->barrier();
  if (!lead) return 0;
  write_svg_chart(r.out + "/curves.svg", "braid-train: gpt on " + std::filesystem::path(r.data).filename().string(),
                  {{"cross-entropy per character", {train_curve, val_curve}}});
  std::printf("sample:\n%s\n", sample.c_str());
  std::printf("final validation loss %.4f; model %s/model.stage*.braid (%d file%s), log %s/log.csv, plot %s/curves.svg\n",
              val_loss, r.out.c_str(), P, P == 1 ? "" : "s", r.out.c_str(), r.out.c_str());
  return 0;
}

}  // namespace braid::zoo
