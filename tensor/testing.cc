#include "tensor/testing.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/backend.h"
#include "tensor/runtime.h"

namespace tandem {
namespace testing {

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool HasCuda() { return DeviceCount(DeviceType::kCUDA) > 0; }

std::string NoCudaReason() {
  Backend* cuda = FindBackend(DeviceType::kCUDA);
  if (cuda == nullptr) return "this build has no CUDA backend (built with --config=cpu?)";
  const std::string reason = cuda->UnavailableReason();
  return reason.empty() ? "no CUDA device" : reason;
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.shape() == b.shape(), "MaxAbsDiff: shapes ", ShapeToString(a.shape()), " and ",
               ShapeToString(b.shape()), " differ");
  const std::vector<float> x = a.detach().to(Device::Cpu(0)).to(kFloat32).to_vector<float>();
  const std::vector<float> y = b.detach().to(Device::Cpu(0)).to(kFloat32).to_vector<float>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::abs(static_cast<double>(x[i]) - y[i]);
    // NaN on one side only is as far apart as it gets.
    if (std::isnan(diff) && !(std::isnan(x[i]) && std::isnan(y[i]))) return INFINITY;
    if (!std::isnan(diff)) worst = std::max(worst, diff);
  }
  return worst;
}

}  // namespace testing
}  // namespace tandem
