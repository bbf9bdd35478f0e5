#include "data/idx.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/test_util.h"
#include "tensor/error.h"

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
  for (const std::string path : {dir + "/a.gz", dir + "/a"}) {
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

}  // namespace
}  // namespace data
}  // namespace tandem
