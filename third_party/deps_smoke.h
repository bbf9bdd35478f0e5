// A tiny library over the system dependencies, used by deps_smoke_test (and
// as the instrumented code for `bazel coverage //third_party:deps_smoke_test`).
#ifndef TANDEM_THIRD_PARTY_DEPS_SMOKE_H_
#define TANDEM_THIRD_PARTY_DEPS_SMOKE_H_

#include <cstdint>
#include <string>

namespace tandem::deps_smoke {

// absl::StrFormat("%s=%d", key, value).
std::string FormatPair(const std::string& key, int value);

// Row-major 2x2 C = A * B with cblas_sgemm.
void Sgemm2x2(const float a[4], const float b[4], float c[4]);

// zlib's CRC-32 of `data`.
uint32_t Crc32(const std::string& data);

}  // namespace tandem::deps_smoke

#endif  // TANDEM_THIRD_PARTY_DEPS_SMOKE_H_
