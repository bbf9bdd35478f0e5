#include "parallel/distributed/internal/optimizer_state_name.h"

#include <algorithm>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed::internal {

std::pair<size_t, std::string> SplitOptimizerStateName(const std::string& owner,
                                                       const std::string& name, size_t parameters) {
  const size_t dot = name.find('.', 6);
  size_t index = 0;
  bool ok =
      name.rfind("state.", 0) == 0 && dot != std::string::npos && dot > 6 && dot + 1 < name.size();
  if (ok) {
    const std::string digits = name.substr(6, dot - 6);
    ok = std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         digits.size() < 10;
    if (ok) index = std::stoul(digits);
  }
  TANDEM_CHECK(ok, owner, "state entry \"", name,
               "\" is not of the form state.<parameter index>.<field>; load a dict from "
               "state_dict() of this optimizer or of the optimizer it wraps");
  TANDEM_CHECK(index < parameters, owner, "state entry \"", name, "\" is for parameter ", index,
               " but this optimizer has ", parameters,
               " parameters; load a dict saved over the same parameters");
  return {index, name.substr(dot + 1)};
}

}  // namespace tandem::parallel::distributed::internal
