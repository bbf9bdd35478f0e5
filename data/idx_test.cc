#include "data/idx.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/test_util.h"
#include "tensor/base/error.h"

namespace tandem {
namespace data {
namespace {

using testing::IdxBytes;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::WriteFile;
using testing::WriteGzipFile;

// Runs `read` and returns the tandem::Error message it throws ("" if it does not throw).
template <typename F>
std::string ErrorOf(F read) {
  try {
    read();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> Payload(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return v;
}

TEST(IdxTest, ReadsGzippedAndPlainFiles) {
  const std::string dir = MakeTempDir("idx");
  const std::vector<uint8_t> payload = Payload(2 * 3 * 4);
  const std::vector<uint8_t> file = IdxBytes(IdxMagic(3), {2, 3, 4}, payload);
  WriteGzipFile(dir + "/a.gz", file);
  WriteFile(dir + "/a", file);
  for (const std::string& path : {dir + "/a.gz", dir + "/a"}) {
    const IdxArray array = ReadIdxFile(path, 3);
    EXPECT_EQ(array.dims, (std::vector<int64_t>{2, 3, 4})) << path;
    EXPECT_EQ(array.bytes, payload) << path;
  }
  EXPECT_EQ(IdxMagic(1), 2049u);
  EXPECT_EQ(IdxMagic(3), 2051u);
}

TEST(IdxTest, ReadsFilesLargerThanOneReadChunk) {
  const std::string dir = MakeTempDir("idx");
  const std::vector<uint8_t> payload = Payload(3 * 1000 * 1000);  // about 3 read chunks
  WriteGzipFile(dir + "/big.gz", IdxBytes(IdxMagic(2), {3000, 1000}, payload));
  EXPECT_EQ(ReadIdxFile(dir + "/big.gz", 2).bytes, payload);
}

TEST(IdxTest, MissingFileNamesThePath) {
  const std::string path = MakeTempDir("idx") + "/nothing-here.gz";
  const std::string message = ErrorOf([&] { ReadIdxFile(path, 1); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(IdxTest, WrongMagicNumber) {
  const std::string path = MakeTempDir("idx") + "/labels.gz";
  WriteGzipFile(path, IdxBytes(IdxMagic(3), {4}, Payload(4)));
  const std::string message = ErrorOf([&] { ReadIdxFile(path, 1); });
  EXPECT_NE(message.find("magic number 2051"), std::string::npos) << message;
  EXPECT_NE(message.find("2049"), std::string::npos) << message;
}

TEST(IdxTest, FewerItemsThanTheHeaderSays) {
  const std::string path = MakeTempDir("idx") + "/short.gz";
  WriteGzipFile(path, IdxBytes(IdxMagic(1), {10}, Payload(9)));
  const std::string message = ErrorOf([&] { ReadIdxFile(path, 1); });
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("10 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("only 9"), std::string::npos) << message;
}

TEST(IdxTest, MoreBytesThanTheHeaderSays) {
  const std::string path = MakeTempDir("idx") + "/long.gz";
  WriteGzipFile(path, IdxBytes(IdxMagic(1), {10}, Payload(12)));
  const std::string message = ErrorOf([&] { ReadIdxFile(path, 1); });
  EXPECT_NE(message.find("2 unexpected bytes"), std::string::npos) << message;
}

TEST(IdxTest, TruncatedHeader) {
  const std::string path = MakeTempDir("idx") + "/header.gz";
  std::vector<uint8_t> bytes = IdxBytes(IdxMagic(3), {5, 28, 28}, {});
  bytes.resize(10);  // magic and half the dimensions
  WriteGzipFile(path, bytes);
  EXPECT_NE(ErrorOf([&] { ReadIdxFile(path, 3); }).find("truncated inside its header"),
            std::string::npos);
  WriteGzipFile(path, {0, 0});
  EXPECT_NE(ErrorOf([&] { ReadIdxFile(path, 3); }).find("too short"), std::string::npos);
}

TEST(IdxTest, TruncatedGzipStream) {
  const std::string dir = MakeTempDir("idx");
  WriteGzipFile(dir + "/full.gz", IdxBytes(IdxMagic(1), {5000}, Payload(5000)));
  std::vector<uint8_t> compressed = ReadFile(dir + "/full.gz");
  compressed.resize(compressed.size() / 2);
  WriteFile(dir + "/cut.gz", compressed);
  const std::string message = ErrorOf([&] { ReadIdxFile(dir + "/cut.gz", 1); });
  EXPECT_NE(message.find(dir + "/cut.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("gzip"), std::string::npos) << message;
}

TEST(IdxTest, CorruptGzipBody) {
  const std::string dir = MakeTempDir("idx");
  WriteGzipFile(dir + "/full.gz", IdxBytes(IdxMagic(1), {5000}, Payload(5000)));
  std::vector<uint8_t> compressed = ReadFile(dir + "/full.gz");
  // Keep the 10-byte gzip header, garble the deflate stream.
  for (size_t i = 10; i + 8 < compressed.size(); ++i) compressed[i] ^= 0x5A;
  WriteFile(dir + "/bad.gz", compressed);
  const std::string message = ErrorOf([&] { ReadIdxFile(dir + "/bad.gz", 1); });
  EXPECT_NE(message.find("not a valid gzip file"), std::string::npos) << message;
}

TEST(IdxTest, CorruptGzipChecksum) {
  const std::string dir = MakeTempDir("idx");
  WriteGzipFile(dir + "/full.gz", IdxBytes(IdxMagic(1), {100}, Payload(100)));
  std::vector<uint8_t> compressed = ReadFile(dir + "/full.gz");
  compressed[compressed.size() - 8] ^= 0xFF;  // first byte of the CRC-32 trailer
  WriteFile(dir + "/crc.gz", compressed);
  const std::string message = ErrorOf([&] { ReadIdxFile(dir + "/crc.gz", 1); });
  EXPECT_NE(message.find("not a valid gzip file"), std::string::npos) << message;
}

TEST(IdxTest, RejectsBadDimensionCount) { EXPECT_THROW(ReadIdxFile("/dev/null", 0), Error); }

TEST(IdxTest, HeaderCheckRunsBeforeTheDataIsRead) {
  const std::string path = MakeTempDir("idx") + "/images.gz";
  // 32x24 images where 28x28 are expected, with as many bytes as 28x28 images would have:
  // the check sees the header's dimensions, not the length mismatch they lead to.
  WriteGzipFile(path, IdxBytes(IdxMagic(3), {2, 32, 24}, Payload(2 * 28 * 28)));
  std::vector<int64_t> seen;
  const std::string message = ErrorOf([&] {
    ReadIdxFile(path, 3, [&](const std::vector<int64_t>& dims) {
      seen = dims;
      if (dims[1] != 28 || dims[2] != 28) throw Error("wrong dimensions");
    });
  });
  EXPECT_EQ(message, "wrong dimensions");
  EXPECT_EQ(seen, (std::vector<int64_t>{2, 32, 24}));
  // Without a check the same file is a length mismatch.
  EXPECT_NE(ErrorOf([&] { ReadIdxFile(path, 3); }).find("unexpected bytes"), std::string::npos);
  // A check that accepts changes nothing.
  int calls = 0;
  WriteGzipFile(path, IdxBytes(IdxMagic(3), {2, 3, 4}, Payload(24)));
  EXPECT_EQ(ReadIdxFile(path, 3, [&](const std::vector<int64_t>&) { ++calls; }).bytes, Payload(24));
  EXPECT_EQ(calls, 1);
}

TEST(IdxTest, AHeaderPromisingMoreThanTheCapIsRefusedBeforeReading) {
  const std::string path = MakeTempDir("idx") + "/huge.gz";
  WriteGzipFile(path, IdxBytes(IdxMagic(3), {70000, 1000, 1000}, Payload(10)));
  const std::string message = ErrorOf([&] { ReadIdxFile(path, 3); });
  EXPECT_NE(message.find(path + " has a header promising 70000x1000x1000 = 70000000000 bytes"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("more than the 4294967296"), std::string::npos) << message;
  // Dimensions whose product overflows 64 bits.
  WriteGzipFile(path, IdxBytes(IdxMagic(3), {4294967295u, 4294967295u, 4294967295u}, {}));
  EXPECT_NE(ErrorOf([&] { ReadIdxFile(path, 3); }).find("= more than 2^64 bytes"),
            std::string::npos);
}

TEST(IdxTest, EndlessFilesHitTheSizeCap) {
  // /dev/zero never ends: the reader stops at the cap with an error naming the file.
  const std::string message = ErrorOf([&] { ReadGzipFile("/dev/zero", 1 << 20); });
  EXPECT_NE(message.find("/dev/zero holds more than 1048576 bytes"), std::string::npos) << message;
  // As an IDX file it fails at once, on its magic number.
  EXPECT_NE(ErrorOf([&] { ReadIdxFile("/dev/zero", 1); }).find("/dev/zero has magic number 0"),
            std::string::npos);
  // At the cap exactly is fine.
  const std::string path = MakeTempDir("idx") + "/exact";
  WriteFile(path, Payload(1000));
  EXPECT_EQ(ReadGzipFile(path, 1000), Payload(1000));
  EXPECT_NE(ErrorOf([&] { ReadGzipFile(path, 999); }).find("holds more than 999 bytes"),
            std::string::npos);
}

}  // namespace
}  // namespace data
}  // namespace tandem
