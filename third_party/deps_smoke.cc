#include "third_party/deps_smoke.h"

#include <cblas.h>
#include <zlib.h>

#include "absl/strings/str_format.h"

namespace tandem::deps_smoke {

std::string FormatPair(const std::string& key, int value) {
  return absl::StrFormat("%s=%d", key, value);
}

void Sgemm2x2(const float a[4], const float b[4], float c[4]) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
}

uint32_t Crc32(const std::string& data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
  return static_cast<uint32_t>(crc);
}

}  // namespace tandem::deps_smoke
