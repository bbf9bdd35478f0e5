// The trainer binary (//examples:train) end to end on a small slice of Fashion-MNIST: a run
// killed in epoch 3 and restarted from its checkpoint ends with exactly the parameters and
// optimizer state of a run never interrupted; bad flags are one-line errors with exit
// status 1; the CSV, the SVG plot and the final JSON line are written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "examples/trainer.h"
#include "nn/checkpoint.h"
#include "tensor/tensor.h"
#include "tests/run_program.h"

namespace tandem {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";
// Small enough for seconds, large enough for several steps an epoch on two devices.
constexpr char kCommon[] =
    " --devices=cpu:0,cpu:1 --threads=1 --epochs=4 --batch_size=64 --train_limit=640"
    " --test_limit=300 --workers=1 --seed=7";

using ::tandem::testing::LastLine;
using ::tandem::testing::ProgramResult;
using ::tandem::testing::ReadFile;
using ::tandem::testing::TestTempDir;

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

// Runs the trainer with `flags`; its output goes to files named after `name`. A run with
// --kill_in_epoch (a test hook, not a flag of the shipped trainer) runs
// //examples:train_with_test_hooks, the same trainer built with its hooks.
ProgramResult Train(const std::string& name, const std::string& flags) {
  const bool hooked = flags.find("--kill_in_epoch") != std::string::npos;
  return ::tandem::testing::RunProgram(hooked ? "examples/train_with_test_hooks" : "examples/train",
                                       flags, name);
}

// Every tensor in a checkpoint, by name, as raw bytes.
std::map<std::string, std::string> Contents(const std::string& path) {
  std::map<std::string, std::string> contents;
  for (const nn::CheckpointEntry& e : nn::ReadCheckpoint(path)) {
    const Tensor v = e.value.contiguous();
    std::string bytes;
    if (v.dtype() == kFloat32) {
      const std::vector<float> values = v.reshape({v.numel()}).to_vector<float>();
      bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    } else if (v.dtype() == kFloat64) {  // a GradScaler's scale and factors
      const std::vector<double> values = v.reshape({v.numel()}).to_vector<double>();
      bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
    } else {
      const std::vector<int64_t> values = v.reshape({v.numel()}).to_vector<int64_t>();
      bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
    }
    contents[e.name] = bytes;
  }
  return contents;
}

class TrainResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Exists(std::string(kData) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed in " << kData
                   << " (Debian package dataset-fashion-mnist)";
    }
  }
};

TEST_F(TrainResumeTest, RunKilledInEpochThreeResumesToExactlyTheSameParameters) {
  const std::string straight = TestTempDir() + "/straight.ckpt";
  const std::string resumed = TestTempDir() + "/resumed.ckpt";
  std::remove(straight.c_str());
  std::remove(resumed.c_str());

  const ProgramResult full = Train("straight", std::string(kCommon) + " --checkpoint=" + straight);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_THAT(full.out, Not(HasSubstr("Resuming")));

  const ProgramResult killed =
      Train("killed", std::string(kCommon) + " --checkpoint=" + resumed + " --kill_in_epoch=3");
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
  EXPECT_THAT(killed.out, HasSubstr("epoch 2/4  train loss"));
  EXPECT_THAT(killed.out, Not(HasSubstr("epoch 3/4  train loss")));
  ASSERT_TRUE(Exists(resumed));
  EXPECT_NE(Contents(resumed), Contents(straight));  // two epochs short

  const ProgramResult restarted =
      Train("restarted", std::string(kCommon) + " --checkpoint=" + resumed);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  EXPECT_THAT(restarted.out, HasSubstr("Resuming from " + resumed + ": 2 of 4 epochs done"));
  EXPECT_THAT(restarted.out, Not(HasSubstr("epoch 2/4  train loss")));
  EXPECT_THAT(restarted.out, HasSubstr("epoch 3/4  train loss"));
  EXPECT_THAT(restarted.out, Not(HasSubstr("will not repeat")));

  // Model, optimizer state, progress and random state: bit for bit. (The history differs
  // only in its timings, so it is compared without them.)
  std::map<std::string, std::string> a = Contents(straight), b = Contents(resumed);
  ASSERT_EQ(a.size(), b.size());
  int compared = 0;
  for (const auto& [name, bytes] : a) {
    if (name == "trainer.history") continue;
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(bytes == b[name]) << name << " differs";
    compared += name.rfind("model.", 0) == 0 || name.rfind("optimizer.", 0) == 0;
  }
  EXPECT_EQ(compared, 12);  // 6 parameters and 6 momentum buffers
  // The same test accuracy, printed in the same final JSON line (but for the timings).
  const std::string json_a = LastLine(full.out), json_b = LastLine(restarted.out);
  EXPECT_EQ(json_a.substr(0, json_a.find("\"train_seconds\"")),
            json_b.substr(0, json_b.find("\"train_seconds\"")));
}

// --autocast=fp16: the GradScaler's scale and growth tracker are in the checkpoint, so the
// resumed run ends with the uninterrupted run's model, optimizer and scaler, bit for bit.
TEST_F(TrainResumeTest, AFloat16RunKilledInEpochThreeResumesWithItsGradScaler) {
  const std::string flags = std::string(kCommon) + " --autocast=fp16 --checkpoint=";
  const std::string straight = TestTempDir() + "/fp16_straight.ckpt";
  const std::string resumed = TestTempDir() + "/fp16_resumed.ckpt";
  std::remove(straight.c_str());
  std::remove(resumed.c_str());
  const ProgramResult full = Train("fp16_straight", flags + straight);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_THAT(full.out, HasSubstr("Autocast to float16 (--autocast) with a GradScaler"));
  const ProgramResult killed = Train("fp16_killed", flags + resumed + " --kill_in_epoch=3");
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
  const ProgramResult restarted = Train("fp16_restarted", flags + resumed);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  EXPECT_THAT(restarted.out, HasSubstr("Resuming from " + resumed + ": 2 of 4 epochs done"));
  std::map<std::string, std::string> a = Contents(straight), b = Contents(resumed);
  ASSERT_EQ(a.size(), b.size());
  int scaler_entries = 0;
  for (const auto& [name, bytes] : a) {
    if (name == "trainer.history") continue;
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(bytes == b[name]) << name << " differs";
    scaler_entries += name.rfind("scaler.", 0) == 0;
  }
  EXPECT_EQ(scaler_entries, 5);  // scale, growth and backoff factors, interval, tracker
  // A float32 run refuses the float16 checkpoint, naming the precision.
  const ProgramResult f32 = Train("fp16_as_f32", std::string(kCommon) + " --checkpoint=" + resumed);
  EXPECT_EQ(f32.exit_code, 1);
  EXPECT_THAT(f32.err, HasSubstr("was saved by a run with model=mlp optimizer=sgd "
                                 "autocast=float16 but this run has model=mlp optimizer=sgd;"));
}

TEST_F(TrainResumeTest, WritesCsvPlotSummaryAndAFinalJsonLine) {
  const std::string csv = TestTempDir() + "/run.csv", svg = TestTempDir() + "/run.svg";
  const ProgramResult r = Train("outputs", std::string(kCommon) + " --epochs=2 --log_csv=" + csv +
                                               " --plot=" + svg + " --noforward_loss");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("batch 64 split 32+32"));
  EXPECT_THAT(r.out, HasSubstr("loss on the gathered output"));
  EXPECT_THAT(r.out, HasSubstr("split 10 x 32+32"));  // 640 images in batches of 64
  EXPECT_THAT(r.out, HasSubstr("Summary: mlp on cpu:0, cpu:1"));
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*  cpu:0   peak +[0-9.]+ MiB(.|\n)*"));
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*  cpu:1   peak +[0-9.]+ MiB(.|\n)*"));
  EXPECT_THAT(LastLine(r.out),
              MatchesRegex("\\{\"model\":\"mlp\",\"devices\":\\[\"cpu:0\",\"cpu:1\"\\],"
                           "\"epochs\":2,\"batch_size\":64,\"test_accuracy\":0\\.[0-9]{4},"
                           "\"train_seconds\":[0-9]+\\.[0-9],\"samples_per_s\":[0-9]+\\.[0-9],"
                           "\"at_chance_level\":false\\}"));
  EXPECT_THAT(r.out, Not(HasSubstr("chance level")));
  // Not a terminal: plain progress lines, no carriage returns.
  EXPECT_THAT(r.out, Not(HasSubstr("\r")));

  const std::string table = ReadFile(csv);
  EXPECT_THAT(table, StartsWith("epoch,train_loss,test_loss,test_accuracy,seconds,samples_per_s\n"
                                "1,"));
  EXPECT_THAT(table, HasSubstr("\n2,"));
  const std::string plot = ReadFile(svg);
  EXPECT_THAT(plot, HasSubstr("<svg"));
  EXPECT_THAT(plot, HasSubstr("Fashion-MNIST: mlp on cpu:0 + cpu:1, batch 64"));
  EXPECT_EQ(std::count(plot.begin(), plot.end(), '\n') > 20, true);
}

TEST_F(TrainResumeTest, TraceHoldsTheFirstStepsOfEveryThread) {
  const std::string path = TestTempDir() + "/train_trace.json";
  const ProgramResult r = Train("trace", std::string(kCommon) + " --epochs=1 --trace=" + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 640 images in batches of 64: the epoch ends before 50 steps, and the trace with it.
  EXPECT_THAT(r.out, HasSubstr("trace of 10 steps: " + path));
  const std::string trace = ReadFile(path);
  EXPECT_THAT(trace, HasSubstr("\"args\":{\"name\":\"cpu:1 worker\"}"));
  EXPECT_THAT(trace, HasSubstr("\"args\":{\"name\":\"DataLoader worker 0\"}"));
  EXPECT_THAT(trace, HasSubstr("\"name\":\"epoch 1 step 10\""));
  EXPECT_THAT(trace, Not(HasSubstr("\"name\":\"epoch 1 step 11\"")));
}

TEST_F(TrainResumeTest, BatchSmallerThanTheDevicesTrainsAndSaysHowItSplit) {
  const ProgramResult r = Train("small_batch",
                                "--devices=cpu:0,cpu:1,cpu:2 --threads=1 --epochs=1 --batch_size=2 "
                                "--train_limit=8 --test_limit=10");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("batch 2 split 1+1 (2 chunks for 3 devices"));
  EXPECT_THAT(r.out, HasSubstr("split 4 x 1+1"));
}

// --sync_bn without --distributed: the ResNet's BatchNorm layers normalise over the whole batch
// across DataParallel's devices (parallel/sync_batch_norm_test.cc checks the numbers).
TEST_F(TrainResumeTest, SyncBatchNormAcrossDataParallelDevicesTrains) {
  const ProgramResult r = Train("sync_bn",
                                "--model=resnet --devices=cpu:0,cpu:1 --threads=1 --epochs=1 "
                                "--batch_size=8 --train_limit=32 --test_limit=16 --sync_bn");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "BatchNorm over the whole batch across the devices \\(--sync_bn\\): "
                         "[1-9][0-9]* layers synchronized"));
}

// Test hooks live in //examples:train_with_test_hooks: the shipped trainer's help lists none,
// and refuses --kill_in_epoch as an unknown flag.
TEST(TrainHelpTest, TheShippedTrainerHasNoTestHook) {
  const ProgramResult help = Train("helpfull", "--helpfull");
  EXPECT_THAT(help.out + help.err, HasSubstr("--checkpoint"));
  EXPECT_THAT(help.out + help.err, Not(HasSubstr("kill_in_epoch")));
  EXPECT_THAT(help.out + help.err, Not(HasSubstr("(testing)")));
  const ProgramResult refused =
      ::tandem::testing::RunProgram("examples/train", "--kill_in_epoch=1", "refused_hook");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("kill_in_epoch"));
}

// examples::NamedSettings (what --distributed ranks compare) names every flag of the trainer
// but --device (an alias of --devices) and --distributed (the strategy itself): a flag added
// to examples/train.cc without its line there would go uncompared.
TEST(TrainHelpTest, EveryTrainerFlagIsANamedSetting) {
  const ProgramResult help = Train("helpfull_flags", "--helpfull");
  std::set<std::string> flags;
  bool in_trainer = false;
  std::istringstream lines(help.out + help.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  Flags from ", 0) == 0)
      in_trainer = line.find("examples/train.cc") != line.npos;
    if (in_trainer && line.rfind("    --", 0) == 0) {
      flags.insert(line.substr(4, line.find(' ', 6) - 4));
    }
  }
  std::set<std::string> named = {"--device", "--distributed"};
  for (const examples::NamedSetting& s : examples::NamedSettings(examples::TrainConfig())) {
    named.insert(s.flag);
  }
  EXPECT_EQ(flags, named);
}

TEST_F(TrainResumeTest, BadFlagsAreOneLineErrorsWithExitStatusOne) {
  const std::string mlp_checkpoint = TestTempDir() + "/for_cnn.ckpt";
  std::remove(mlp_checkpoint.c_str());
  ASSERT_EQ(
      Train("mlp", std::string(kCommon) + " --epochs=1 --checkpoint=" + mlp_checkpoint).exit_code,
      0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--devices=gpu:0", "invalid device 'gpu:0'"},
      {"--devices=cpu:0,cpu:0", "lists cpu:0 more than once"},
      {"--devices=cpu:0, --epochs=1", "invalid device list"},
      {"--device=cpu:0 --devices=cpu:1", "are both set"},
      {"--epochs=0", "--epochs must be at least 1 but is 0"},
      {"--model=vgg", "--model must be 'mlp', 'cnn', 'resnet' or 'gpt' but is 'vgg'"},
      {"--devices=cpu:0,cpu:1 --threads=64", "--threads=64 with 2 CPU device(s) needs 128 cores"},
      {"--model=cnn --checkpoint=" + mlp_checkpoint,
       "was saved by a run with model=mlp optimizer=sgd but this run has model=cnn"},
      {"--epochs=two", "Illegal value"},
      {"--device=cpu:1024", "there is no device cpu:1024: expected CPU devices cpu:0 to cpu:1023"},
      {"--lr=inf", "--lr must be a positive finite number but is inf"},
      {"--lr=nan", "--lr must be a positive finite number but is nan"},
      {"--lr=-1", "--lr must be a positive finite number but is -1"},
      {"--sharding=zero1",
       "--sharding=zero1 shards the optimizer state across the ranks of --distributed"},
      {"--sync_bn", "--sync_bn synchronizes BatchNorm layers but --model=mlp has none"},
      {"--save=/nonexistent-dir/m.ckpt",
       "--save=/nonexistent-dir/m.ckpt: expected an existing "
       "folder '/nonexistent-dir' but it does not exist"},
      {"--checkpoint=/proc/x/run.ckpt", "--checkpoint=/proc/x/run.ckpt: expected an existing"},
      {"--log_csv=" + TestTempDir(), "--log_csv=" + TestTempDir() + " is a folder"},
      {"--plot=/proc/self/x.svg", "--plot=/proc/self/x.svg: cannot create a file in"},
  };
  for (const auto& [flags, message] : cases) {
    const ProgramResult r = Train("bad", flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_THAT(r.err, HasSubstr(message)) << flags;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << flags << ": " << r.err;
    // Issue 14, defect 6: no internal function names, no numbers the user did not type.
    EXPECT_THAT(r.err, Not(HasSubstr("SetCpuDeviceCount"))) << flags;
    EXPECT_THAT(r.err, Not(HasSubstr("1025"))) << flags;
  }
}

// Defect 5 of issue 14: a bad output path fails at once, before the data is even read.
TEST_F(TrainResumeTest, UnwritableOutputFailsBeforeTheFirstStep) {
  const ProgramResult r =
      Train("unwritable_save", std::string(kCommon) + " --save=/nonexistent-dir/m.ckpt");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("create it or choose another path"));
  EXPECT_EQ(r.out, "");
}

// Defect 4 of issue 14: a learning rate that makes training diverge stops it with an error
// naming the epoch and the step, instead of training on with a NaN loss and exiting 0.
TEST_F(TrainResumeTest, ANonFiniteLossStopsTrainingNamingTheEpochAndStep) {
  const ProgramResult r = Train("diverge", std::string(kCommon) + " --lr=1e6 --lr_decay=none");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.err, StartsWith("train: the training loss became "));
  EXPECT_THAT(r.err, ContainsRegex("became (NaN|-?inf) at epoch 1, step [0-9]+ of 10 "));
  EXPECT_THAT(r.err, HasSubstr("lower --lr (now 1e+06)"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// Issue 21, item 8: a checkpoint whose random state does not match the run that saved it
// (trainer.generator.cpu:0 renamed or missing) is refused, naming the file and the entry,
// instead of resuming inexactly without a word.
TEST_F(TrainResumeTest, ACheckpointWithARenamedOrMissingGeneratorIsRefused) {
  const std::string path = TestTempDir() + "/generator.ckpt";
  std::remove(path.c_str());
  const std::string flags = std::string(kCommon) + " --epochs=2 --checkpoint=" + path;
  ASSERT_EQ(
      Train("generator_saved", std::string(kCommon) + " --epochs=1 --checkpoint=" + path).exit_code,
      0);
  const std::vector<nn::CheckpointEntry> good = nn::ReadCheckpoint(path);
  for (const std::string renamed : {"trainer.generator.cpu:7", "trainer.generator.cuda:0", ""}) {
    std::vector<nn::CheckpointEntry> entries;
    for (nn::CheckpointEntry e : good) {
      if (e.name == "trainer.generator.cpu:0") {
        if (renamed.empty()) continue;  // removed
        e.name = renamed;
      }
      entries.push_back(e);
    }
    nn::WriteCheckpoint(entries, path);
    const ProgramResult r = Train("generator_altered", flags);
    EXPECT_EQ(r.exit_code, 1) << renamed << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr("train: checkpoint '" + path + "': entry '" +
                                 (renamed.empty() ? "trainer.generator.cpu:0" : renamed) + "' "))
        << renamed;
    EXPECT_THAT(r.err, HasSubstr(renamed.empty() ? "is missing"
                                                 : "is not for a device of the run "
                                                   "that saved it"))
        << renamed;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_THAT(r.out, Not(HasSubstr("Resuming")));
  }
}

// Issue 21, item 9: a run that does not learn ends with exit status 0 (it did what it was
// asked) but says in the summary that its accuracy stayed at chance level, naming the flags.
TEST_F(TrainResumeTest, ARunAtChanceLevelSaysSoAndNamesTheFlags) {
  const ProgramResult r = Train("chance",
                                " --devices=cpu:0,cpu:1 --threads=1 --epochs=3 --batch_size=64 "
                                "--train_limit=6400 --test_limit=1000 --workers=1 --seed=7 "
                                "--optimizer=adam --lr=100 --lr_decay=none");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ContainsRegex("warning: the final test accuracy \\([0-9.]+%\\) is at chance "
                                   "level for 10 classes \\(10.00% by guessing"));
  EXPECT_THAT(r.out, HasSubstr("the model did not learn. Look at --lr (now 100; 0.05 suits sgd, "
                               "0.001 adam) and --optimizer (now adam)\n"));
  EXPECT_THAT(LastLine(r.out), HasSubstr(",\"at_chance_level\":true}"));
}

// Issue 21, item 7: --log_csv, --plot and --trace on a full file system (a 64 KiB tmpfs, filled,
// in a private mount namespace: `unshare -rm`, as root or where user namespaces are allowed;
// skipped elsewhere) stop the run with the system's reason, leave no partial file and keep
// the previous file whole.
TEST_F(TrainResumeTest, AFullDiskSaysNoSpaceLeftAndKeepsThePreviousOutputs) {
  if (std::system("unshare -rm true > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "cannot make a private mount namespace here (unshare -rm)";
  }
  const std::vector<std::pair<std::string, std::string>> outputs = {
      {"--log_csv", "log.csv"}, {"--plot", "plot.svg"}, {"--trace", "trace.json"}};
  for (const auto& [flag, file] : outputs) {
    const std::string report = TestTempDir() + "/full_" + file;
    const std::string disk = report + ".disk";
    ASSERT_EQ(
        std::system(
            ("rm -rf " + report + " " + disk + " && mkdir -p " + report + " " + disk).c_str()),
        0);
    const std::string script =
        "mount -t tmpfs -o size=64k tandem-full " + disk + " || exit 77; " + "printf previous > " +
        disk + "/" + file + "; " + "cat /dev/zero > " + disk + "/filler 2> /dev/null; " +
        "examples/train" + kCommon + " --epochs=1 " + flag + "=" + disk + "/" + file + " > " +
        report + "/out 2> " + report + "/err; " + "echo $? > " + report + "/status; ls -A " + disk +
        " > " + report + "/listing; cat " + disk + "/" + file + " > " + report + "/after";
    const ProgramResult r =
        ::tandem::testing::RunProgram("unshare", "-rm sh -c '" + script + "'", "full_" + file);
    if (r.exit_code == 77) GTEST_SKIP() << "cannot mount a tmpfs here: " << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string err = ReadFile(report + "/err");
    EXPECT_EQ(ReadFile(report + "/status"), "1\n") << flag << ": " << ReadFile(report + "/out");
    EXPECT_THAT(err, StartsWith("train: cannot write ")) << flag;
    EXPECT_THAT(err,
                HasSubstr(" '" + disk + "/" + file + "': writing '" + disk + "/" + file + ".tmp."))
        << flag;
    EXPECT_THAT(err, HasSubstr("failed: No space left on device; the previous file, if any, is "
                               "unchanged (the temporary file was removed)\n"))
        << flag;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_EQ(ReadFile(report + "/after"), "previous") << flag;
    EXPECT_EQ(ReadFile(report + "/listing"), "filler\n" + file + "\n") << flag;
  }
}

}  // namespace
}  // namespace tandem
