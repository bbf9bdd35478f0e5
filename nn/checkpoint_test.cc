#include "nn/checkpoint.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <thread>

#include "nn/layers.h"
#include "nn/sequential.h"
#include "nn/test_util.h"
#include "tensor/runtime/devices.h"

namespace tandem::nn {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using testing::ErrorOf;
using ::testing::HasSubstr;

// A small model with parameters in submodules and an int64 buffer of its own.
class Net : public Cloneable<Net> {
 public:
  explicit Net(int64_t hidden = 3) : hidden_(hidden) { reset(); }
  void reset() override {
    body_ = register_module("body", Sequential(Linear(4, hidden_), ReLU(), Linear(hidden_, 2)));
    counts_ = register_buffer("counts", arange(5, kInt64));
  }
  Tensor forward(const Tensor& x) { return body_->forward(x); }

 private:
  int64_t hidden_;
  std::shared_ptr<Sequential> body_;
  Buffer counts_;
};

// Whether two tensors of one dtype and shape hold the same bytes (NaN payloads included).
bool EqualBits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::Cpu(0)).contiguous(), y = b.to(Device::Cpu(0)).contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.numel() * ElementSize(x.dtype())) == 0;
}

// Every parameter and buffer, by name, as host values (float buffers as doubles).
std::map<std::string, std::vector<double>> StateOf(const Module& module) {
  std::map<std::string, std::vector<double>> state;
  for (const NamedTensor& p : module.named_parameters()) {
    const std::vector<float> v = p.value.to(Device::Cpu(0)).to_vector<float>();
    state[p.name] = std::vector<double>(v.begin(), v.end());
  }
  for (const NamedTensor& b : module.named_buffers()) {
    const std::vector<int64_t> v = b.value.to(Device::Cpu(0)).to_vector<int64_t>();
    state[b.name] = std::vector<double>(v.begin(), v.end());
  }
  return state;
}

std::vector<char> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(2);
    manual_seed(0);
    dir_ = fs::path(::testing::TempDir()) /
           ("nn_checkpoint_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string PathOf(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTripRestoresEveryTensor) {
  Net saved;
  {
    NoGradGuard no_grad;
    Tensor counts = saved.buffer("counts");
    counts.fill_(9.0);  // buffers travel too
  }
  const std::string path = PathOf("net.ckpt");
  SaveCheckpoint(saved, path);

  Net loaded;
  loaded.to(Device::Cpu(1));
  const Tensor weight_before = loaded.parameter("body.0.weight");
  ASSERT_NE(StateOf(loaded), StateOf(saved));
  LoadCheckpoint(loaded, path);
  EXPECT_EQ(StateOf(loaded), StateOf(saved));
  // Loaded in place: same tensors, still on their device, still parameters.
  EXPECT_EQ(loaded.parameter("body.0.weight").impl(), weight_before.impl());
  EXPECT_EQ(weight_before.device(), Device::Cpu(1));
  EXPECT_TRUE(weight_before.requires_grad());

  const std::vector<CheckpointEntry> entries = ReadCheckpoint(path);
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[0].name, "body.0.weight");
  EXPECT_FALSE(entries[0].is_buffer);
  EXPECT_EQ(entries[0].value.shape(), (Shape{3, 4}));
  EXPECT_EQ(entries[4].name, "counts");
  EXPECT_TRUE(entries[4].is_buffer);
  EXPECT_EQ(entries[4].value.dtype(), kInt64);
  EXPECT_EQ(Files(), std::vector<std::string>{"net.ckpt"});  // no temporary left behind
}

// Every dtype's bytes come back exactly (NaN payloads, the 16-bit extremes, int32's minimum,
// uint8's 255, bool), through the file level and through a module's parameters and buffers.
TEST_F(CheckpointTest, EveryDtypeRoundTripsBitForBit) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> floats = {1.5f, -0.1f, 65504.0f, nan, -0.0f, 3e-8f};
  std::vector<CheckpointEntry> entries = {
      {"f32", false, from_vector(floats, {2, 3})},
      {"i64", true, from_vector(std::vector<int64_t>{int64_t{1} << 62, -7}, {2})},
      {"f64", false, from_vector(std::vector<double>{0.1, -1e300}, {2})},
      {"bf16", false, from_vector(floats, {6}, kBFloat16)},
      {"f16", false, from_vector(floats, {3, 2}, kFloat16)},
      {"bool", true, from_vector(std::vector<bool>{true, false, true}, {3})},
      {"i32", true, from_vector(std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 5}, {2})},
      {"u8", true, from_vector(std::vector<uint8_t>{0, 255, 128}, {1, 3})},
      {"bf16 scalar", true, scalar_tensor(-2.5, kBFloat16)},
  };
  const std::string path = PathOf("dtypes.ckpt");
  WriteCheckpoint(entries, path);
  const std::vector<CheckpointEntry> loaded = ReadCheckpoint(path);
  ASSERT_EQ(loaded.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    SCOPED_TRACE(entries[i].name);
    const Tensor& a = entries[i].value;
    const Tensor& b = loaded[i].value;
    EXPECT_EQ(loaded[i].name, entries[i].name);
    EXPECT_EQ(loaded[i].is_buffer, entries[i].is_buffer);
    ASSERT_EQ(b.dtype(), a.dtype());
    ASSERT_EQ(b.shape(), a.shape());
    const size_t bytes = static_cast<size_t>(a.numel()) * ElementSize(a.dtype());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), bytes), 0);
  }

  // A bfloat16 model with a bool and a uint8 buffer, loaded into another on cpu:1.
  struct Mixed : Cloneable<Mixed> {
    Mixed() { reset(); }
    void reset() override {
      register_parameter("w", randn({3, 2}).to(kBFloat16));
      register_parameter("v", randn({4}).to(kFloat16));
      register_buffer("mask", zeros({2}, kBool));
      register_buffer("pixels", zeros({3}, kUInt8));
    }
  };
  Mixed saved;
  {
    NoGradGuard no_grad;
    saved.buffer("mask").copy_(from_vector(std::vector<bool>{false, true}, {2}));
    saved.buffer("pixels").copy_(from_vector(std::vector<uint8_t>{7, 0, 255}, {3}));
  }
  SaveCheckpoint(saved, PathOf("mixed.ckpt"));
  Mixed restored;
  restored.to(Device::Cpu(1));
  LoadCheckpoint(restored, PathOf("mixed.ckpt"));
  for (const std::string name : {"w", "v"}) {
    const Tensor p = restored.parameter(name);
    EXPECT_EQ(p.device(), Device::Cpu(1));
    EXPECT_EQ(p.dtype(), saved.parameter(name).dtype());
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(EqualBits(p, saved.parameter(name)));
  }
  EXPECT_EQ(restored.buffer("mask").to(Device::Cpu(0)).to_vector<bool>(),
            (std::vector<bool>{false, true}));
  EXPECT_EQ(restored.buffer("pixels").to(Device::Cpu(0)).to_vector<uint8_t>(),
            (std::vector<uint8_t>{7, 0, 255}));
}

// A zero-element tensor (here a buffer registered as zeros({0})) saves and loads: reading
// it back used to hand memcpy a null destination (UBSan aborted under --config=asan).
class WithEmptyBuffer : public Cloneable<WithEmptyBuffer> {
 public:
  WithEmptyBuffer() { reset(); }
  void reset() override {
    register_buffer("nothing", zeros({0}));
    register_buffer("no_ids", zeros({0, 3}, TensorOptions(kInt64)));
    register_parameter("w", ones({2}));
  }
};

TEST_F(CheckpointTest, ZeroElementTensorsRoundTrip) {
  WithEmptyBuffer saved;
  const std::string path = PathOf("empty.ckpt");
  SaveCheckpoint(saved, path);
  WithEmptyBuffer loaded;
  LoadCheckpoint(loaded, path);
  EXPECT_EQ(loaded.buffer("nothing").shape(), (Shape{0}));
  EXPECT_EQ(loaded.buffer("no_ids").shape(), (Shape{0, 3}));
  EXPECT_EQ(loaded.buffer("no_ids").dtype(), kInt64);
  const std::vector<CheckpointEntry> entries = ReadCheckpoint(path);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[1].value.numel(), 0);
}

TEST_F(CheckpointTest, EveryTruncationIsRefusedAndChangesNothing) {
  Net saved;
  const std::string path = PathOf("net.ckpt");
  SaveCheckpoint(saved, path);
  const std::vector<char> bytes = ReadBytes(path);
  Net target;
  const auto before = StateOf(target);
  const std::string cut = PathOf("cut.ckpt");
  for (size_t size = 0; size < bytes.size(); ++size) {
    WriteBytes(cut, std::vector<char>(bytes.begin(), bytes.begin() + size));
    const std::string error = ErrorOf([&] { LoadCheckpoint(target, cut); });
    ASSERT_THAT(error, AnyOf(HasSubstr("is truncated"), HasSubstr("is not a Tandem checkpoint")))
        << "after cutting the file to " << size << " of " << bytes.size() << " bytes";
  }
  EXPECT_EQ(StateOf(target), before);
  EXPECT_THAT(ErrorOf([&] {
                WriteBytes(cut, std::vector<char>(bytes.begin(), bytes.end() - 1));
                LoadCheckpoint(target, cut);
              }),
              HasSubstr("checkpoint '" + cut +
                        "' is truncated or corrupted: record 4 of 5 "
                        "checksum needs 4 bytes"));
}

TEST_F(CheckpointTest, EveryFlippedByteIsDetectedAndChangesNothing) {
  Net saved;
  const std::string path = PathOf("net.ckpt");
  SaveCheckpoint(saved, path);
  const std::vector<char> bytes = ReadBytes(path);
  Net target;
  const auto before = StateOf(target);
  const std::string flipped = PathOf("flipped.ckpt");
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::vector<char> corrupt = bytes;
    corrupt[at] = static_cast<char>(corrupt[at] ^ 0x5a);
    WriteBytes(flipped, corrupt);
    ASSERT_NE(ErrorOf([&] { LoadCheckpoint(target, flipped); }), "<no error>")
        << "flipping byte " << at << " of " << bytes.size() << " went unnoticed";
  }
  EXPECT_EQ(StateOf(target), before);
  // A flip inside the last tensor's values: its record's checksum fails.
  std::vector<char> corrupt = bytes;
  corrupt[bytes.size() - 10] ^= 1;
  WriteBytes(flipped, corrupt);
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(target, flipped); }),
              HasSubstr("is corrupted: record 4 of 5 fails its CRC32 check"));
  // Extra bytes after the last record.
  corrupt = bytes;
  corrupt.push_back('x');
  WriteBytes(flipped, corrupt);
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(target, flipped); }),
              HasSubstr("1 unexpected bytes follow its last record"));
  WriteBytes(flipped, {'h', 'e', 'l', 'l', 'o', ',', ' ', 'w', 'o', 'r', 'l', 'd', '!', '!', '!'});
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(target, flipped); }),
              HasSubstr("is not a Tandem checkpoint"));
}

TEST_F(CheckpointTest, MismatchedModulesAreRefusedNamingEveryDifference) {
  Net saved(/*hidden=*/3);
  const std::string path = PathOf("net.ckpt");
  SaveCheckpoint(saved, path);
  Net wider(/*hidden=*/5);
  const auto before = StateOf(wider);
  const std::string error = ErrorOf([&] { LoadCheckpoint(wider, path); });
  EXPECT_THAT(error, HasSubstr("does not match Net (nothing was loaded)"));
  EXPECT_THAT(error, HasSubstr("parameter 'body.0.weight' is [3, 4] float32 in the checkpoint but "
                               "[5, 4] float32 in the module"));
  EXPECT_THAT(error, HasSubstr("parameter 'body.2.weight' is [2, 3] float32 in the checkpoint but "
                               "[2, 5] float32 in the module"));
  EXPECT_EQ(StateOf(wider), before);

  Sequential other(Linear(4, 3), ReLU(), Linear(3, 2), Linear(2, 2));
  const std::string other_error = ErrorOf([&] { LoadCheckpoint(other, path); });
  EXPECT_THAT(other_error, HasSubstr("parameter '0.weight' is missing from the checkpoint"));
  EXPECT_THAT(other_error, HasSubstr("parameter '3.bias' is missing from the checkpoint"));
  EXPECT_THAT(other_error, HasSubstr("the checkpoint's parameter 'body.0.weight' is not in the "
                                     "module"));
  EXPECT_THAT(other_error, HasSubstr("the checkpoint's buffer 'counts' is not in the module"));
}

TEST_F(CheckpointTest, AFailedSaveLeavesThePreviousFileInPlace) {
  const std::string path = PathOf("net.ckpt");
  Net small;
  SaveCheckpoint(small, path);
  const std::vector<char> good = ReadBytes(path);

  // Make writes fail part-way: files may not grow past 100 bytes (SIGXFSZ ignored, so
  // write() reports EFBIG instead of killing the process).
  Linear big(64, 64);
  std::string error;
  {
    tandem::testing::FileSizeLimit limit(100);
    error = ErrorOf([&] { SaveCheckpoint(big, path); });
  }

  EXPECT_THAT(error, HasSubstr("cannot write checkpoint '" + path + "': writing"));
  EXPECT_THAT(error, HasSubstr("the previous file, if any, is unchanged"));
  EXPECT_EQ(ReadBytes(path), good);
  EXPECT_EQ(Files(), std::vector<std::string>{"net.ckpt"});
  Net reloaded;
  LoadCheckpoint(reloaded, path);
  EXPECT_EQ(StateOf(reloaded), StateOf(small));
}

TEST_F(CheckpointTest, ReportsFileSystemErrors) {
  Net net;
  EXPECT_THAT(ErrorOf([&] { SaveCheckpoint(net, PathOf("missing/dir/net.ckpt")); }),
              HasSubstr("creating a temporary file in '" + PathOf("missing/dir") + "' failed"));
  // Renaming a file over a directory fails: the temporary file must not be left behind.
  fs::create_directories(PathOf("occupied"));
  EXPECT_THAT(ErrorOf([&] { SaveCheckpoint(net, PathOf("occupied")); }),
              HasSubstr("renaming the temporary file over it failed"));
  EXPECT_EQ(Files(), std::vector<std::string>{"occupied"});
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(net, PathOf("absent.ckpt")); }),
              HasSubstr("cannot open checkpoint '" + PathOf("absent.ckpt") + "'"));
}

mode_t ModeOf(const std::string& path) {
  struct stat info;
  EXPECT_EQ(stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

// Issue 14, defect 2: a save killed part-way leaves "<path>.tmp.XXXXXX"; the next save to
// the same path removes it, but not a temporary a live save holds (locked), nor another
// checkpoint's.
TEST_F(CheckpointTest, RemovesTheTemporariesOfKilledSavesOfTheSamePath) {
  const std::string path = PathOf("net.ckpt");
  WriteBytes(path + ".tmp.k1LLed", std::vector<char>(1000, 'x'));
  WriteBytes(path + ".tmp.Old123", std::vector<char>(10, 'x'));
  WriteBytes(PathOf("other.ckpt.tmp.k1LLed"), {'x'});
  WriteBytes(path + ".tmp.toolong7", {'x'});
  WriteBytes(path + ".tmp.Live00", {'x'});
  const int live = open((path + ".tmp.Live00").c_str(), O_RDONLY);
  ASSERT_GE(live, 0);
  ASSERT_EQ(flock(live, LOCK_EX), 0);  // a save in progress
  Net net;
  SaveCheckpoint(net, path);
  std::vector<std::string> files = Files();
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"net.ckpt", "net.ckpt.tmp.Live00",
                                             "net.ckpt.tmp.toolong7", "other.ckpt.tmp.k1LLed"}));
  close(live);
  SaveCheckpoint(net, path);  // now unlocked: its save is gone
  EXPECT_FALSE(fs::exists(path + ".tmp.Live00"));
  Net reloaded;
  LoadCheckpoint(reloaded, path);
  EXPECT_EQ(StateOf(reloaded), StateOf(net));
}

// Issue 14, defect 3: a new file honours the umask; a replaced one keeps its mode.
TEST_F(CheckpointTest, NewFilesHonourTheUmaskAndReplacedFilesKeepTheirMode) {
  Net net;
  const mode_t saved_umask = umask(027);
  SaveCheckpoint(net, PathOf("new.ckpt"));
  umask(saved_umask);
  EXPECT_EQ(ModeOf(PathOf("new.ckpt")), 0640u);

  SaveCheckpoint(net, PathOf("private.ckpt"));
  ASSERT_EQ(chmod(PathOf("private.ckpt").c_str(), 0600), 0);
  SaveCheckpoint(net, PathOf("private.ckpt"));
  EXPECT_EQ(ModeOf(PathOf("private.ckpt")), 0600u);
  ASSERT_EQ(chmod(PathOf("private.ckpt").c_str(), 0664), 0);
  SaveCheckpoint(net, PathOf("private.ckpt"));
  EXPECT_EQ(ModeOf(PathOf("private.ckpt")), 0664u);
}

// Issue 14, defect 3: saving through a symbolic link (relative, or a chain) replaces the
// target and keeps the link, as writing through it would; a dangling link gets its target.
TEST_F(CheckpointTest, SavingThroughASymbolicLinkReplacesItsTarget) {
  fs::create_directories(PathOf("store"));
  Net first;
  SaveCheckpoint(first, PathOf("store/real.ckpt"));
  fs::create_symlink("store/real.ckpt", PathOf("link.ckpt"));
  fs::create_symlink("link.ckpt", PathOf("link2.ckpt"));
  manual_seed(5);
  Net second;
  SaveCheckpoint(second, PathOf("link2.ckpt"));
  EXPECT_TRUE(fs::is_symlink(PathOf("link.ckpt")));
  EXPECT_TRUE(fs::is_symlink(PathOf("link2.ckpt")));
  Net reloaded;
  LoadCheckpoint(reloaded, PathOf("store/real.ckpt"));
  EXPECT_EQ(StateOf(reloaded), StateOf(second));
  EXPECT_NE(StateOf(reloaded), StateOf(first));

  fs::create_symlink("store/later.ckpt", PathOf("dangling.ckpt"));
  SaveCheckpoint(second, PathOf("dangling.ckpt"));
  EXPECT_TRUE(fs::is_symlink(PathOf("dangling.ckpt")));
  EXPECT_TRUE(fs::is_regular_file(PathOf("store/later.ckpt")));

  fs::create_symlink("loop.ckpt", PathOf("loop.ckpt"));
  EXPECT_THAT(ErrorOf([&] { SaveCheckpoint(second, PathOf("loop.ckpt")); }),
              HasSubstr("more than 40 symbolic links"));
}

// ---- Hand-made files: what SaveCheckpoint never writes ------------------------------------

// CRC-32 (zlib's polynomial), bit by bit: independent of the code under test.
uint32_t TestCrc32(const std::vector<char>& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) {
    crc ^= static_cast<uint8_t>(c);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

template <typename T>
void Append(std::vector<char>& out, T value) {
  const char* p = reinterpret_cast<const char*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

// A float32 parameter record body with the given sizes and `values` floats of data.
std::vector<char> ParameterBody(const std::string& name, const std::vector<int64_t>& sizes,
                                uint64_t values) {
  std::vector<char> body;
  Append<uint8_t>(body, 0);  // parameter
  Append<uint8_t>(body, 0);  // float32
  Append<uint32_t>(body, static_cast<uint32_t>(name.size()));
  body.insert(body.end(), name.begin(), name.end());
  Append<uint32_t>(body, static_cast<uint32_t>(sizes.size()));
  for (const int64_t size : sizes) Append<int64_t>(body, size);
  Append<uint64_t>(body, values * 4);
  for (uint64_t i = 0; i < values; ++i) Append<float>(body, 0.5f);
  return body;
}

// A whole version-1 file holding `bodies`, each with a correct length and CRC.
std::vector<char> CheckpointFile(const std::vector<std::vector<char>>& bodies) {
  std::vector<char> file = {'T', 'A', 'N', 'D', 'E', 'M', 'C', 'K'};
  Append<uint32_t>(file, 1);
  Append<uint32_t>(file, static_cast<uint32_t>(bodies.size()));
  Append<uint32_t>(file, TestCrc32(file));
  for (const std::vector<char>& body : bodies) {
    Append<uint32_t>(file, static_cast<uint32_t>(body.size()));
    file.insert(file.end(), body.begin(), body.end());
    Append<uint32_t>(file, TestCrc32(body));
  }
  return file;
}

TEST_F(CheckpointTest, HandMadeFilesMatchTheWriter) {
  // The helpers above write what WriteCheckpoint writes (so the tests below test the reader).
  WriteCheckpoint({{"w", false, full({2, 1}, 0.5f)}}, PathOf("written.ckpt"));
  EXPECT_EQ(ReadBytes(PathOf("written.ckpt")), CheckpointFile({ParameterBody("w", {2, 1}, 2)}));
}

// Issue 14: ranks 9 to 64 passed the reader's check and failed in the tensor layer, whose
// message did not name the checkpoint.
TEST_F(CheckpointTest, ARankBeyondWhatTensorsHoldIsRefusedNamingTheRecord) {
  const std::string path = PathOf("rank.ckpt");
  WriteBytes(path, CheckpointFile({ParameterBody("ok", {1, 1, 1, 1, 1, 1, 1, 3}, 3)}));
  ASSERT_EQ(ReadCheckpoint(path)[0].value.shape(), (Shape{1, 1, 1, 1, 1, 1, 1, 3}));
  for (const uint32_t rank : {9u, 17u, 64u, 65u, 4000000000u}) {
    // Sizes of 1 where they fit in a test file; the last record holds its rank field alone.
    std::vector<char> deep =
        ParameterBody("deep", std::vector<int64_t>(rank <= 65 ? rank : 0, 1), 1);
    std::memcpy(deep.data() + 10, &rank, 4);  // after kind, dtype, name length and "deep"
    WriteBytes(path, CheckpointFile({ParameterBody("a", {}, 1), deep}));
    EXPECT_THAT(ErrorOf([&] { ReadCheckpoint(path); }),
                HasSubstr("checkpoint '" + path + "' is corrupted: record 1 ('deep') has rank " +
                          std::to_string(rank) + " but tensors have at most 8 dimensions"))
        << "rank " << rank;
  }
}

// Issue 14: a negative size printed a half-parsed shape such as [2, -3, 0].
TEST_F(CheckpointTest, ANegativeSizeIsNamedWithItsDimension) {
  const std::string path = PathOf("negative.ckpt");
  WriteBytes(path, CheckpointFile({ParameterBody("w", {2, -3, 4}, 0)}));
  const std::string error = ErrorOf([&] { ReadCheckpoint(path); });
  EXPECT_THAT(error, HasSubstr("checkpoint '" + path +
                               "' is corrupted: record 0 ('w') has size -3 in dimension 1 of 3"));
  EXPECT_THAT(error, ::testing::Not(HasSubstr("[2, -3")));  // no half-parsed shape
  WriteBytes(path, CheckpointFile({ParameterBody("w", {INT64_MIN}, 0)}));
  EXPECT_THAT(ErrorOf([&] { ReadCheckpoint(path); }),
              HasSubstr("has size -9223372036854775808 in dimension 0 of 1"));
}

TEST_F(CheckpointTest, EndlessAndHugeFilesStopAtTheSizeCap) {
  // /dev/zero never ends: its first 8 bytes are not a checkpoint's, so reading stops there.
  EXPECT_THAT(ErrorOf([&] { ReadCheckpoint("/dev/zero"); }),
              HasSubstr("'/dev/zero' is not a Tandem checkpoint"));
  Net net;
  EXPECT_THAT(ErrorOf([&] { LoadCheckpoint(net, "/dev/zero"); }),
              HasSubstr("'/dev/zero' is not a Tandem checkpoint"));

  // A regular file above the cap is refused before it is read; at the cap it loads.
  const std::string path = PathOf("net.ckpt");
  SaveCheckpoint(net, path);
  const auto size = static_cast<uint64_t>(fs::file_size(path));
  EXPECT_EQ(ReadCheckpoint(path, size).size(), 5u);
  EXPECT_THAT(ErrorOf([&] { ReadCheckpoint(path, size - 1); }),
              HasSubstr("checkpoint '" + path + "' is " + std::to_string(size) +
                        " bytes, more than the limit of " + std::to_string(size - 1) + " bytes"));

  // An endless pipe that starts like a checkpoint stops at the cap.
  const std::string fifo = PathOf("endless");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::signal(SIGPIPE, SIG_IGN);
  std::thread writer([&] {
    const int fd = open(fifo.c_str(), O_WRONLY);
    if (fd < 0) return;
    std::vector<char> chunk(1 << 16, 0);
    std::memcpy(chunk.data(), "TANDEMCK", 8);
    while (write(fd, chunk.data(), chunk.size()) > 0) std::memset(chunk.data(), 0, 8);
    close(fd);
  });
  const std::string error = ErrorOf([&] { ReadCheckpoint(fifo, 1 << 20); });
  writer.join();
  EXPECT_THAT(error, HasSubstr("checkpoint '" + fifo +
                               "' holds more than 1048576 bytes, the "
                               "limit"));
}

TEST_F(CheckpointTest, LoadsIntoCuda) {
  TANDEM_SKIP_WITHOUT_CUDA();
  Net saved;
  const std::string path = PathOf("net.ckpt");
  SaveCheckpoint(saved, path);
  Net loaded;
  loaded.to(Device::Cuda(0));
  LoadCheckpoint(loaded, path);
  EXPECT_EQ(loaded.parameter("body.0.weight").device(), Device::Cuda(0));
  EXPECT_EQ(StateOf(loaded), StateOf(saved));
  SaveCheckpoint(loaded, PathOf("from_gpu.ckpt"));  // reads values back from the device
  EXPECT_EQ(ReadBytes(PathOf("from_gpu.ckpt")), ReadBytes(path));
}

}  // namespace
}  // namespace tandem::nn
