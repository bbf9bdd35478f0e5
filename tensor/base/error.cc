#include "tensor/base/error.h"

namespace tandem {
namespace internal {

void ThrowError(const char* file, int line, const std::string& message) {
  std::string where = file;
  // Keep the path relative to the workspace root: it reads better in test logs.
  const auto pos = where.rfind("tandem/");
  if (pos != std::string::npos) where = where.substr(pos + 7);
  throw Error(message + " [" + where + ":" + std::to_string(line) + "]");
}

}  // namespace internal
}  // namespace tandem
