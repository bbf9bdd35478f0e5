// Errors: the one exception type Tandem throws and the check macro that builds it.
//
// Misuse and runtime failures throw tandem::Error (a std::runtime_error) whose message
// says what was expected, what was found and how to fix it, prefixed by file and line:
//
//   TANDEM_CHECK(a.dim() == 2, "matmul expects a 2-D tensor but got ", a.dim(),
//                " dimensions; reshape the input first");
#ifndef TANDEM_TENSOR_BASE_ERROR_H_
#define TANDEM_TENSOR_BASE_ERROR_H_

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace internal {

template <typename... Args>
std::string Concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] void ThrowError(const char* file, int line, const std::string& message);

}  // namespace internal
}  // namespace tandem

// Throws tandem::Error with the concatenated message when `condition` is false.
#define TANDEM_CHECK(condition, ...)                                                               \
  do {                                                                                             \
    if (!(condition)) {                                                                            \
      ::tandem::internal::ThrowError(__FILE__, __LINE__, ::tandem::internal::Concat(__VA_ARGS__)); \
    }                                                                                              \
  } while (false)

// Throws tandem::Error unconditionally.
#define TANDEM_FAIL(...) \
  ::tandem::internal::ThrowError(__FILE__, __LINE__, ::tandem::internal::Concat(__VA_ARGS__))

#endif  // TANDEM_TENSOR_BASE_ERROR_H_
