// braid-device-bench: the device benchmarks of benchmarks/device_bench.py, which runs the same
// workloads in PyTorch in the same run and prints the ratios. Each workload prints one JSON line:
// {"name", "ms" (median wall time per iteration, the device synchronised around it), "flop" (the
// model FLOPs of one iteration)}.
//
//   braid-device-bench --device cuda --suite gemm|conv|resnet50|gpt2|buckets [--small] [--repeats N]
//                      [--amp off]
//
// gemm: C = A B at n^3 in float32, in TF32 (CUDA only) and under autocast(bfloat16) (float32
//   accumulation, float32 out).
// conv: forward + backward (data and filter) of ResNet-50's convolution shapes, batch 64.
// resnet50: one training step (forward, cross-entropy, backward, SGD with momentum) at batch 64,
//   224^2, under autocast(bfloat16).
// gpt2: one training step of a GPT-2-small-shaped causal Transformer (12 pre-norm layers, d 768,
//   12 heads, GELU, vocabulary 50257) at batch 8 x 1024 tokens under autocast(bfloat16), AdamW-free
//   Adam. --small shrinks every workload so that the CPU and CI-sized machines can run it.
// buckets: DistributedDataParallel's gradient buckets of ResNet-50 and the GPT-2-shaped model, and
//   when in backward each is ready (one JSON line per model; benchmarks/gpu_scaling.py).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "braid/amp.h"
#include "braid/braid.h"
#include "braid/distributed.h"
#include "braid/nn/attention.h"
#include "braid/nn/loss.h"
#include "braid/optim.h"
#include "models.h"

using namespace braid;

namespace {

struct Options {
  Device device = Device::cpu();
  std::string suite = "gemm";
  bool small = false;
  bool amp = true;  // --amp off: the training steps in float32
  int repeats = 10;
};

// The medians of an iteration's wall time (the device synchronised around it) and of its host
// time: until the host has issued the iteration, before the synchronisation. Where the two are
// close, the iteration is bound by the host's launches, allocations and dispatch, not the device.
struct Timing {
  double ms, host_ms;
};

Timing median_ms(const Options& o, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();  // warm-up: allocator pools, cuBLAS/cuDNN plans
  synchronize(o.device);
  std::vector<double> ms, host;
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < o.repeats; ++i) {
    const auto t0 = Clock::now();
    body();
    host.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    synchronize(o.device);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::sort(host.begin(), host.end());
  return {ms[ms.size() / 2], host[host.size() / 2]};
}

void report(const std::string& name, Timing t, double flop) {
  std::printf("{\"name\": \"%s\", \"ms\": %.6f, \"host_ms\": %.6f, \"flop\": %.6e}\n", name.c_str(), t.ms,
              t.host_ms, flop);
  std::fflush(stdout);
}

void gemm(const Options& o) {
  const std::vector<int64_t> sizes = o.small ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{4096, 8192};
  for (int64_t n : sizes) {
    Tensor a = randn({n, n}, kFloat32, nullptr, 0.0, 1.0, o.device);
    Tensor b = randn({n, n}, kFloat32, nullptr, 0.0, 1.0, o.device);
    const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    report(detail::cat("gemm_f32_", n), median_ms(o, [&] { matmul(a, b); }), flop);
    if (o.device.type == DeviceType::CUDA) {  // TF32 exists on CUDA only (the CPU ignores the setting)
      set_float32_matmul_precision("high");
      report(detail::cat("gemm_tf32_", n), median_ms(o, [&] { matmul(a, b); }), flop);
      set_float32_matmul_precision("highest");
    }
    report(detail::cat("gemm_bf16_", n), median_ms(o, [&] {
             autocast amp(kBFloat16);
             matmul(a, b);
           }), flop);
  }
}

struct ConvShape {
  const char* name;
  int64_t cin, cout, k, stride, hw;
};

void conv(const Options& o) {
  // ResNet-50's distinct convolutions (input size hw): the stem, each stage's 3x3, and 1x1s.
  const std::vector<ConvShape> shapes = {{"stem7x7", 3, 64, 7, 2, 224},        {"s1_3x3", 64, 64, 3, 1, 56},
                                         {"s1_1x1_expand", 64, 256, 1, 1, 56}, {"s2_3x3", 128, 128, 3, 1, 28},
                                         {"s3_3x3", 256, 256, 3, 1, 14},       {"s3_1x1_reduce", 1024, 256, 1, 1, 14},
                                         {"s4_3x3", 512, 512, 3, 1, 7}};
  const int64_t batch = o.small ? 2 : 64;
  for (const ConvShape& s : shapes) {
    const int64_t hw = o.small ? std::max<int64_t>(s.hw / 4, s.k) : s.hw;
    const int64_t cin = o.small ? std::max<int64_t>(s.cin / 4, 3) : s.cin, cout = o.small ? s.cout / 4 : s.cout;
    Tensor x = randn({batch, cin, hw, hw}, kFloat32, nullptr, 0.0, 1.0, o.device);
    Tensor w = randn({cout, cin, s.k, s.k}, kFloat32, nullptr, 0.0, 0.05, o.device);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    const int64_t pad = s.k / 2, out = (hw + 2 * pad - s.k) / s.stride + 1;
    // forward + backward data + backward filter: three products of the same size
    const double flop = 3.0 * 2.0 * static_cast<double>(batch * cout * out * out * cin * s.k * s.k);
    report(detail::cat("conv_fwd_bwd_", s.name), median_ms(o, [&] {
             Tensor y = conv2d(x, w, Tensor(), {s.stride, s.stride}, {pad, pad});
             sum(y).backward();
             x.set_grad(Tensor());
             w.set_grad(Tensor());
           }), flop);
  }
}

void resnet50_step(const Options& o) {
  const int64_t batch = o.small ? 2 : 64, hw = o.small ? 64 : 224;
  manual_seed(0);
  auto model = zoo::resnet50(1000);
  model->to(o.device);
  optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  Tensor x = randn({batch, 3, hw, hw}, kFloat32, nullptr, 0.0, 1.0, o.device);
  Tensor y = randint(0, 1000, {batch}, kInt64, nullptr, o.device);
  // ResNet-50's forward pass is 4.09 G multiply-adds (8.18 GFLOP) per 224^2 image; a training step
  // (forward, backward data, backward filter) is three times that.
  const double flop = 3.0 * 2.0 * 4.09e9 * static_cast<double>(batch) * static_cast<double>(hw * hw) / (224.0 * 224.0);
  report(o.amp ? "resnet50_step_amp_bf16" : "resnet50_step_f32", median_ms(o, [&] {
           Tensor loss;
           {
             autocast amp(kBFloat16, o.amp);
             loss = nn::cross_entropy((*model)(x), y);
           }
           opt.zero_grad();
           loss.backward();
           opt.step();
         }), flop);
}

/// A GPT-2-shaped causal language model: token and position embeddings, pre-norm Transformer
/// layers under a causal mask, a final LayerNorm and an untied output projection.
class CausalLM : public nn::Module {
 public:
  CausalLM(int64_t vocab, int64_t ctx, int64_t d, int64_t heads, int64_t layers) : Module("CausalLM") {
    tok_ = register_module("tok", std::make_shared<nn::Embedding>(vocab, d));
    pos_ = register_module("pos", std::make_shared<nn::Embedding>(ctx, d));
    for (int64_t i = 0; i < layers; ++i)
      blocks_.push_back(register_module(detail::cat("h", i), std::make_shared<nn::TransformerEncoderLayer>(
                                                                      d, heads, 4 * d, 0.0, "gelu", 1e-5, true, true)));
    ln_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(d));
    head_ = register_module("head", std::make_shared<nn::Linear>(d, vocab, false));
  }
  Tensor forward(const Tensor& ids) override {
    const int64_t t = ids.size(1);
    Tensor h = tok_->forward(ids) + pos_->forward(arange(t, kInt64, ids.device()));
    Tensor mask = nn::generate_square_subsequent_mask(t, kFloat32, ids.device());
    for (auto& b : blocks_) h = b->forward(h, mask);
    return head_->forward(ln_->forward(h));
  }

 private:
  std::shared_ptr<nn::Embedding> tok_, pos_;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_;
  std::shared_ptr<nn::Linear> head_;
};

void gpt2_step(const Options& o) {
  const int64_t vocab = o.small ? 1000 : 50257, d = o.small ? 128 : 768, heads = o.small ? 4 : 12;
  const int64_t layers = o.small ? 2 : 12, batch = o.small ? 2 : 8, seq = o.small ? 64 : 1024;
  manual_seed(0);
  CausalLM model(vocab, seq, d, heads, layers);
  model.to(o.device);
  optim::Adam opt(model.parameters(), optim::AdamOptions{.lr = 3e-4});
  Tensor ids = randint(0, vocab, {batch, seq}, kInt64, nullptr, o.device);
  Tensor target = randint(0, vocab, {batch * seq}, kInt64, nullptr, o.device);
  // Model FLOPs per step (PaLM's count): 6 N per token for the weights N (the embeddings'
  // lookups excluded), plus 12 L T d per token for attention's score and value products.
  const double n = static_cast<double>(model.num_parameters() - vocab * d - seq * d);
  const double tokens = static_cast<double>(batch * seq);
  const double flop = 6.0 * n * tokens + 12.0 * static_cast<double>(layers * seq * d) * tokens;
  report(o.amp ? "gpt2_step_amp_bf16" : "gpt2_step_f32", median_ms(o, [&] {
           Tensor loss;
           {
             autocast amp(kBFloat16, o.amp);
             loss = nn::cross_entropy(model.forward(ids).reshape({batch * seq, vocab}), target);
           }
           opt.zero_grad();
           loss.backward();
           opt.step();
         }), flop);
}

/// One backward of model under DistributedDataParallel with its default options (a world of one):
/// the buckets in launch order, their bytes, and when each became ready, as a fraction of the
/// backward pass (the latest grad-ready hook of its parameters). benchmarks/gpu_scaling.py feeds
/// these to its model of NCCL data parallelism at 8 to 1,024 GPUs.
void bucket_profile(const std::string& name, const std::shared_ptr<nn::Module>& model,
                    const std::function<Tensor()>& loss_of) {
  distributed::DistributedDataParallel ddp(model);
  const auto params = model->named_parameters();
  using Clock = std::chrono::steady_clock;
  std::map<std::string, Clock::time_point> ready;
  std::vector<int> ids;
  for (const auto& [pname, p] : params)
    ids.push_back(add_grad_ready_hook(p, [&ready, n = pname] { ready[n] = Clock::now(); }));
  for (int pass = 0; pass < 2; ++pass) {  // the first warms the allocator and the kernels' plans
    ready.clear();
    model->zero_grad();
    Tensor loss = loss_of();
    const auto t0 = Clock::now();
    loss.backward();
    const double total = std::chrono::duration<double>(Clock::now() - t0).count();
    if (pass == 0) continue;
    std::map<std::string, int64_t> bytes;
    for (const auto& [pname, p] : params) bytes[pname] = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    std::printf("{\"kind\": \"buckets\", \"model\": \"%s\", \"parameters\": %lld, \"backward_s\": %.4f, "
                "\"buckets\": [", name.c_str(), static_cast<long long>(model->num_parameters()), total);
    const auto names = ddp.bucket_names();
    for (size_t b = 0; b < names.size(); ++b) {
      int64_t n = 0;
      double at = 0;
      for (const auto& pname : names[b]) {
        n += bytes[pname];
        at = std::max(at, std::chrono::duration<double>(ready[pname] - t0).count() / total);
      }
      std::printf("%s{\"bytes\": %lld, \"ready\": %.4f}", b ? ", " : "", static_cast<long long>(n), at);
    }
    std::printf("]}\n");
    std::fflush(stdout);
  }
  for (size_t i = 0; i < params.size(); ++i) remove_grad_ready_hook(params[i].second, ids[i]);
}

void buckets(const Options& o) {
  manual_seed(0);
  std::shared_ptr<nn::Module> resnet = zoo::resnet50(1000);
  Tensor x = randn({4, 3, 224, 224}, kFloat32, nullptr, 0.0, 1.0, o.device);
  Tensor y = randint(0, 1000, {4}, kInt64, nullptr, o.device);
  resnet->to(o.device);
  bucket_profile("resnet50", resnet, [&] { return nn::cross_entropy((*resnet)(x), y); });
  const int64_t vocab = 50257, seq = 256;
  auto gpt = std::make_shared<CausalLM>(vocab, 1024, 768, 12, 12);
  gpt->to(o.device);
  Tensor ids = randint(0, vocab, {1, seq}, kInt64, nullptr, o.device);
  Tensor target = randint(0, vocab, {seq}, kInt64, nullptr, o.device);
  bucket_profile("gpt2_small", gpt, [&] { return nn::cross_entropy(gpt->forward(ids).reshape({seq, vocab}), target); });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (k == "--small") {
        o.small = true;
        continue;
      }
      BRAID_CHECK(i + 1 < argc, "braid-device-bench: option ", k, " needs a value");
      const std::string v = argv[++i];
      if (k == "--device") o.device = Device::parse(v);
      else if (k == "--suite") o.suite = v;
      else if (k == "--repeats") o.repeats = std::stoi(v);
      else if (k == "--amp") o.amp = v != "off";
      else throw ValueError("braid-device-bench: unknown option '" + k + "'");
    }
    BRAID_CHECK(device_available(o.device), "braid-device-bench: ", o.device.str(), " is not available here");
    if (o.suite == "gemm") gemm(o);
    else if (o.suite == "conv") conv(o);
    else if (o.suite == "resnet50") resnet50_step(o);
    else if (o.suite == "gpt2") gpt2_step(o);
    else if (o.suite == "buckets") buckets(o);
    else throw ValueError("braid-device-bench: unknown suite '" + o.suite + "'; known: gemm, conv, resnet50, gpt2, buckets");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-device-bench: error: %s\n", e.what());
    return 1;
  }
}
