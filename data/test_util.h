// Helpers for the data library's tests: temporary files, gzip writing and reading with
// zlib (independently of the library's own reader), and IDX file contents.
#ifndef TANDEM_DATA_TEST_UTIL_H_
#define TANDEM_DATA_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {
namespace data {
namespace testing {

// A fresh directory under $TEST_TMPDIR (or /tmp) whose name starts with `name`.
std::string MakeTempDir(const std::string& name);

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes);
std::vector<uint8_t> ReadFile(const std::string& path);
// gzip-compresses `bytes` into `path` with zlib's gzwrite.
void WriteGzipFile(const std::string& path, const std::vector<uint8_t>& bytes);
// Decompresses a whole gzip file with zlib's inflate (not gzread, so that the library's
// reader is checked against a different path through zlib).
std::vector<uint8_t> InflateGzipFile(const std::string& path);

// An unsigned-byte IDX file: magic, big-endian dimensions, then `payload`.
std::vector<uint8_t> IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& payload);

}  // namespace testing
}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_TEST_UTIL_H_
