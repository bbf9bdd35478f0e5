// Helpers shared by the data library's sources; not part of its public API.
#ifndef TANDEM_DATA_INTERNAL_H_
#define TANDEM_DATA_INTERNAL_H_

#include <cstdint>
#include <exception>
#include <string>

namespace tandem {
namespace data {
namespace internal {

// what() of the exception being handled (call inside a catch block).
inline std::string CurrentExceptionMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// SplitMix64's finaliser: spreads the bits of `x` so that nearby inputs give unrelated keys.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace internal
}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_INTERNAL_H_
