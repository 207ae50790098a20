// Failure handling, tested from outside: tests/dist_fault.cpp is started under `mpiexec -n 2` and
// `-n 4`, its last rank fails at step 3 (throws, is killed, hangs, or calls a different
// collective), and every rank must be gone within 60 s with a message naming the failed rank.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Outcome {
  int status = -1;  // exit status, or 128 + signal
  double seconds = 0;
  std::string output;
};

/// Runs cmd through the shell with a hard 100 s limit (a hang shows as status 137).
Outcome run(const std::string& cmd) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  FILE* p = popen(("timeout -s KILL 100 " + cmd + " 2>&1").c_str(), "r");
  if (!p) return o;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.output.append(buf.data(), n);
  const int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

std::string job(int np, const std::string& scenario, const std::string& env = "") {
  return "env BRAID_NUM_THREADS=1 OMP_WAIT_POLICY=passive " + env + " " + BRAID_MPIEXEC + " -n " +
         std::to_string(np) + " " + BRAID_DIST_FAULT + " " + scenario;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Faults : public ::testing::TestWithParam<int> {};

TEST_P(Faults, HealthyJobFinishes) {
  const int np = GetParam();
  Outcome o = run(job(np, "none"));
  EXPECT_EQ(o.status, 0) << o.output;
  for (int r = 0; r < np; ++r) EXPECT_TRUE(contains(o.output, "rank " + std::to_string(r) + " finished")) << o.output;
}

TEST_P(Faults, RankThatThrowsEndsTheJobNamingIt) {
  const int np = GetParam();
  Outcome o = run(job(np, "throw"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "rank " + std::to_string(np - 1) + " of " + std::to_string(np)))
      << o.output;
  EXPECT_TRUE(contains(o.output, "injected failure at step 3")) << o.output;
  EXPECT_FALSE(contains(o.output, "rank 0 finished")) << o.output;
}

TEST_P(Faults, RankKilledBySigtermEndsTheJobNamingIt) {
  const int np = GetParam();
  Outcome o = run(job(np, "sigterm"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "rank " + std::to_string(np - 1) + " of " + std::to_string(np)))
      << o.output;
  EXPECT_TRUE(contains(o.output, "killed by signal 15")) << o.output;
}

TEST_P(Faults, RankKilledBySigkillEndsTheJob) {
  // SIGKILL leaves the rank no last word. The job must still end at once; who names the rank is a
  // race between the other ranks' monitors and Hydra's clean-up (Note [Failing ranks end the job]),
  // so the name is not asserted here.
  const int np = GetParam();
  Outcome o = run(job(np, "sigkill"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_FALSE(contains(o.output, "rank 0 finished")) << o.output;
}

TEST_P(Faults, HungRankIsReportedByTheWatchdog) {
  const int np = GetParam();
  Outcome o = run(job(np, "hang", "BRAID_TIMEOUT=5"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "did not complete within 5 s")) << o.output;
  EXPECT_TRUE(contains(o.output, "all_reduce(average")) << o.output;
  // Under load another rank may also be late; the hung one must be among those named.
  EXPECT_TRUE(contains(o.output, "ranks that did not arrive: ")) << o.output;
  EXPECT_TRUE(contains(o.output, std::to_string(np - 1) + " (its latest call on this group is #")) << o.output;
  // Its latest bucket all-reduce finished, and it is in no collective (it sleeps in its own code).
  EXPECT_TRUE(contains(o.output, "finished; now in no collective)")) << o.output;
}

TEST_P(Faults, DeadlockAcrossGroupsNamesWhatEachRankIsIn) {
  // No debug mode: the last rank calls the split group's all-reduce before the world's, the others
  // the other way round. Whichever rank reports first names the other side and the op it is in.
  const int np = GetParam();
  Outcome o = run(job(np, "deadlock", "BRAID_TIMEOUT=5"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "did not complete within 5 s; ranks that did not arrive: ")) << o.output;
  EXPECT_TRUE(contains(o.output, " all_reduce(sum, 12 float32) on group 'world/split(color=0)')") ||
              contains(o.output, " all_reduce(sum, 10 float32) on group 'world')"))
      << o.output;
}

TEST_P(Faults, MismatchedCollectivesAreAnErrorInDebugMode) {
  const int np = GetParam();
  Outcome o = run(job(np, "mismatch", "BRAID_TIMEOUT=30"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "collective mismatch on group 'world' at call #")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank " + std::to_string(np - 1) + " broadcast(root 0, 3 float32)")) << o.output;
  EXPECT_TRUE(contains(o.output, ": rank 0 all_reduce(sum, 10 float32), rank 1 ")) << o.output;
}

TEST_P(Faults, MismatchedCollectivesAreNamedAtTheTimeoutWithoutDebugMode) {
  // The all-reduce of 10 floats on 2 or 4 ranks runs recursive doubling on point-to-point messages,
  // which the broadcast never matches: both sides wait until the timeout, which names the ranks in
  // the other collective (either side may report first).
  const int np = GetParam();
  Outcome o = run(job(np, "mismatch-plain", "BRAID_TIMEOUT=5"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "did not complete within 5 s; ranks in a different collective: ")) << o.output;
  EXPECT_TRUE(contains(o.output, std::to_string(np - 1) + " called broadcast(root 0, 3 float32) as #") ||
              contains(o.output, "0 called all_reduce(sum, 10 float32) as #"))
      << o.output;
}

TEST_P(Faults, MismatchedSizesAreAnErrorInDebugMode) {
  const int np = GetParam();
  Outcome o = run(job(np, "mismatch-size", "BRAID_TIMEOUT=30"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "collective mismatch on group 'world' at call #")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 0 all_reduce(sum, 10 float32)")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank " + std::to_string(np - 1) + " all_reduce(sum, 12 float32)")) << o.output;
}

TEST_P(Faults, SkippedCollectiveIsReportedAtTheNextOneInDebugMode) {
  // The last rank skips an all-reduce; its next call, the first bucket all-reduce of backward, takes
  // the skipped call's number and is reported against it.
  const int np = GetParam();
  Outcome o = run(job(np, "skip", "BRAID_TIMEOUT=30"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "collective mismatch on group 'world' at call #")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 0 all_reduce(sum, 10 float32)")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank " + std::to_string(np - 1) + " all_reduce(")) << o.output;
  EXPECT_FALSE(contains(o.output, "rank " + std::to_string(np - 1) + " all_reduce(sum, 10 float32)")) << o.output;
}

TEST_P(Faults, PipelineStageThatThrowsEndsTheJobNamingIt) {
  // Stage 1 throws in a forward while stage 0 waits for its gradients and stage 2 (at 4 ranks) for
  // its activations.
  const int np = GetParam();
  Outcome o = run(job(np, "pipeline-throw"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 1 of " + std::to_string(np))) << o.output;
  EXPECT_TRUE(contains(o.output, "injected failure in stage 1, forward call 15")) << o.output;
  EXPECT_FALSE(contains(o.output, "rank 0 finished")) << o.output;
}

TEST_P(Faults, PipelineStageKilledEndsTheJob) {
  const int np = GetParam();
  Outcome o = run(job(np, "pipeline-sigkill"));
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 60.0) << o.output;
  EXPECT_FALSE(contains(o.output, "rank 0 finished")) << o.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Faults, ::testing::Values(2, 4), [](const auto& info) {
  return "np" + std::to_string(info.param);
});

// braid-train stopped after one epoch (--stop-after 1) and resumed (--resume) writes, after the
// second epoch, checkpoint files bitwise equal to those of a run that was never interrupted: in
// data-parallel mode and in pipeline mode (one file per stage, each resumed by its own rank), with
// 1F1B and with the interleaved schedule (each stage's file holding its two chunks).
class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, StopAndResumeIsBitwiseTheUninterruptedRun) {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(data + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "Fashion-MNIST is not installed at " << data;
  const bool interleaved = GetParam() == "interleaved", pipeline = GetParam() == "pipeline" || interleaved;
  const std::string dir = ::testing::TempDir() + "braid_resume_" + GetParam();
  const std::string base = "env BRAID_NUM_THREADS=1 OMP_WAIT_POLICY=passive " + std::string(BRAID_MPIEXEC) + " -n 2 " +
                           BRAID_TRAIN + " --model cnn --epochs 2 --limit 640 --batch-size 64" +
                           (pipeline ? " --pipeline-stages 2" : "") + (interleaved ? " --schedule interleaved" : "");
  ASSERT_EQ(run("rm -rf " + dir + " && mkdir -p " + dir).status, 0);
  Outcome whole = run(base + " --out " + dir + "/whole" + (pipeline ? "" : " --export-onnx " + dir + "/cnn.onnx"));
  ASSERT_EQ(whole.status, 0) << whole.output;
  if (!pipeline) {
    // The exported model passes ONNX's checker and runs in onnxruntime at another batch size.
    const std::string py = "import sys, numpy as n\ntry:\n import onnx, onnxruntime as o\nexcept ImportError:\n sys.exit(77)\n"
                           "onnx.checker.check_model(onnx.load(sys.argv[1]))\n"
                           "s = o.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
                           "print('logits', s.run(None, {'input': n.zeros((3, 1, 28, 28), 'float32')})[0].shape)\n";
    Outcome ort = run("python3 -c \"" + py + "\" " + dir + "/cnn.onnx");
    if (ort.status != 77) {
      EXPECT_EQ(ort.status, 0) << ort.output;
      EXPECT_TRUE(contains(ort.output, "logits (3, 10)")) << ort.output;
    }
  }
  Outcome first = run(base + " --out " + dir + "/split --stop-after 1");
  ASSERT_EQ(first.status, 0) << first.output;
  Outcome second = run(base + " --out " + dir + "/split --resume " + dir + (pipeline ? "/split" : "/split/checkpoint.braid"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "resum")) << second.output;
  const std::vector<std::string> files =
      pipeline ? std::vector<std::string>{"checkpoint.stage0.braid", "checkpoint.stage1.braid"}
               : std::vector<std::string>{"checkpoint.braid"};
  for (const std::string& f : files) {
    Outcome same = run("cmp " + dir + "/whole/" + f + " " + dir + "/split/" + f);
    EXPECT_EQ(same.status, 0) << f << ": " << same.output;
  }
  // Resuming with another number of stages merges the stage files (Note [Resuming with another stage
  // count]; tests/slurm/test_resume_world_size.py checks that result bitwise), but stage files of
  // different moments are refused, naming them.
  if (pipeline && !interleaved) {
    Outcome early = run(base + " --out " + dir + "/early --stop-after 1");
    ASSERT_EQ(early.status, 0) << early.output;
    ASSERT_EQ(run("mkdir -p " + dir + "/mixed && cp " + dir + "/early/checkpoint.stage0.braid " + dir +
                  "/whole/checkpoint.stage1.braid " + dir + "/mixed/").status, 0);
    Outcome bad = run("env BRAID_NUM_THREADS=1 " + std::string(BRAID_MPIEXEC) + " -n 4 " + BRAID_TRAIN +
                      " --model cnn --epochs 3 --limit 640 --pipeline-stages 4 --out " + dir + "/y --resume " + dir +
                      "/mixed");
    EXPECT_NE(bad.status, 0) << bad.output;
    EXPECT_TRUE(contains(bad.output, "the stage files come from different moments")) << bad.output;
    EXPECT_TRUE(contains(bad.output, "mixed/checkpoint.stage1.braid")) << bad.output;
  }
}

INSTANTIATE_TEST_SUITE_P(BraidTrain, Resume, ::testing::Values("data_parallel", "pipeline", "interleaved"),
                         [](const auto& info) { return info.param; });

// Schedules that accumulate each parameter's gradient over micro-batches in 1F1B's order train the
// same weights bit for bit: ZB-H1 (same cuts) writes 1F1B's stage files; interleaved 1F1B (the
// model cut into 4 pieces, two per rank) logs 1F1B's losses and accuracies at every epoch.
TEST(BraidTrainSchedules, ZeroBubbleAndInterleavedTrainOneFOneBsWeights) {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(data + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << data;
  const std::string dir = ::testing::TempDir() + "braid_schedules";
  const std::string base = "env BRAID_NUM_THREADS=1 OMP_WAIT_POLICY=passive " + std::string(BRAID_MPIEXEC) + " -n 2 " +
                           BRAID_TRAIN + " --model cnn --epochs 2 --limit 640 --batch-size 64 --pipeline-stages 2";
  ASSERT_EQ(run("rm -rf " + dir + " && mkdir -p " + dir).status, 0);
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"1f1b", "1F1B, 4 micro-batches"}, {"zb-h1", "ZB-H1, 4 micro-batches"}, {"interleaved", "stage 3: layers"}};
  for (const auto& [schedule, shows] : runs) {  // what the plan shows proves the schedule ran
    Outcome o = run(base + " --schedule " + schedule + " --out " + dir + "/" + schedule);
    ASSERT_EQ(o.status, 0) << o.output;
    EXPECT_TRUE(contains(o.output, shows)) << o.output;
  }
  for (const std::string f : {"checkpoint.stage0.braid", "checkpoint.stage1.braid"}) {
    Outcome same = run("cmp " + dir + "/1f1b/" + f + " " + dir + "/zb-h1/" + f);
    EXPECT_EQ(same.status, 0) << f << ": " << same.output;
  }
  Outcome log = run("cmp " + dir + "/1f1b/log.csv " + dir + "/interleaved/log.csv");
  EXPECT_EQ(log.status, 0) << log.output;
}

// The main job on another device and in mixed precision. The shadow device runs the CPU kernels on
// memory of its own, so a run there must write the CPU run's checkpoint bit for bit: anything on
// the way (the loader's transfers, the model's move, evaluation, the checkpoint written from the
// device) that changed a value or touched host memory would show. Mixed precision must track the
// float32 run, and a float16 run (loss scaling, the scaler's state in the checkpoint) must resume
// bitwise.
namespace {
/// The last row's field `column` of braid-train's log.csv.
double last_logged(const std::string& dir, int column) {
  std::ifstream in(dir + "/log.csv");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  std::stringstream row(last);
  std::string field;
  for (int c = 0; c <= column; ++c) std::getline(row, field, ',');
  return std::stod(field);
}
}  // namespace

TEST(BraidTrain, DeviceAndMixedPrecision) {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(data + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "Fashion-MNIST is not installed at " << data;
  const std::string dir = ::testing::TempDir() + "braid_train_devices";
  const std::string base = std::string("env BRAID_NUM_THREADS=1 OMP_WAIT_POLICY=passive ") + BRAID_TRAIN +
                           " --model cnn --epochs 2 --limit 640 --batch-size 64";
  ASSERT_EQ(run("rm -rf " + dir + " && mkdir -p " + dir).status, 0);
  Outcome cpu = run(base + " --device cpu --out " + dir + "/cpu");
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  EXPECT_TRUE(contains(cpu.output, "on cpu")) << cpu.output;
  Outcome shadow = run(base + " --device shadow --out " + dir + "/shadow");
  ASSERT_EQ(shadow.status, 0) << shadow.output;
  EXPECT_TRUE(contains(shadow.output, "on shadow:0")) << shadow.output;
  EXPECT_EQ(run("cmp " + dir + "/cpu/checkpoint.braid " + dir + "/shadow/checkpoint.braid").status, 0);

  // log.csv: step,epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr
  Outcome bf16 = run(base + " --device shadow --amp bf16 --out " + dir + "/bf16");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "mixed precision bf16")) << bf16.output;
  const double loss32 = last_logged(dir + "/cpu", 4), loss16 = last_logged(dir + "/bf16", 4);
  EXPECT_NEAR(loss16, loss32, 0.05 * loss32) << "bfloat16 test loss " << loss16 << " vs float32 " << loss32;
  EXPECT_NEAR(last_logged(dir + "/bf16", 5), last_logged(dir + "/cpu", 5), 0.03);
  // The two runs differ (bfloat16 rounds the products' operands), so the comparison is not vacuous.
  EXPECT_NE(run("cmp -s " + dir + "/cpu/checkpoint.braid " + dir + "/bf16/checkpoint.braid").status, 0);

  Outcome whole = run(base + " --amp fp16 --out " + dir + "/fp16");
  ASSERT_EQ(whole.status, 0) << whole.output;
  Outcome first = run(base + " --amp fp16 --out " + dir + "/fp16_split --stop-after 1");
  ASSERT_EQ(first.status, 0) << first.output;
  Outcome second = run(base + " --amp fp16 --out " + dir + "/fp16_split --resume " + dir + "/fp16_split/checkpoint.braid");
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_EQ(run("cmp " + dir + "/fp16/checkpoint.braid " + dir + "/fp16_split/checkpoint.braid").status, 0);

  Outcome bad = run(base + " --device cuda:7 --out " + dir + "/bad");
  EXPECT_NE(bad.status, 0);
  EXPECT_TRUE(contains(bad.output, "--device cuda:7: cuda:7 is not available here")) << bad.output;
  Outcome bad_amp = run(base + " --amp fp8 --out " + dir + "/bad");
  EXPECT_NE(bad_amp.status, 0);
  EXPECT_TRUE(contains(bad_amp.output, "--amp must be off, bf16 or fp16, got 'fp8'")) << bad_amp.output;
}

TEST(Launch, SrunWithoutMpiWiringRefusesToStart) {
  // What `srun --mpi=none -n 2` gives each task: Slurm says 2 tasks, MPI makes a world of one.
  Outcome o = run(std::string("env SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 "
                              "SLURM_LOCALID=0 ") + BRAID_DIST_FAULT + " none");
  EXPECT_EQ(o.status, 3) << o.output;
  EXPECT_TRUE(contains(o.output, "SLURM_STEP_NUM_TASKS=2")) << o.output;
  EXPECT_TRUE(contains(o.output, "MPI connected a world of 1")) << o.output;
  EXPECT_TRUE(contains(o.output, "srun --mpi=pmi2")) << o.output;
}

TEST(Launch, PlainRunIsAWorldOfOne) {
  Outcome o = run(std::string("env BRAID_NUM_THREADS=1 ") + BRAID_DIST_FAULT + " none");
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(contains(o.output, "ranks: rank 0 = pid")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 0 finished")) << o.output;
}

}  // namespace
