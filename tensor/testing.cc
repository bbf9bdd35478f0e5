#include "tensor/testing.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <vector>

#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

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
  // In float64: exact for every floating dtype, so float64 results are compared to their last bit.
  const std::vector<double> x = a.detach().to(Device::Cpu(0)).to(kFloat64).to_vector<double>();
  const std::vector<double> y = b.detach().to(Device::Cpu(0)).to(kFloat64).to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::abs(x[i] - y[i]);
    // NaN on one side only is as far apart as it gets.
    if (std::isnan(diff) && !(std::isnan(x[i]) && std::isnan(y[i]))) return INFINITY;
    if (!std::isnan(diff)) worst = std::max(worst, diff);
  }
  return worst;
}

FileSizeLimit::FileSizeLimit(uint64_t bytes) {
  if (getrlimit(RLIMIT_FSIZE, &saved_) != 0) {
    TANDEM_FAIL("FileSizeLimit: getrlimit failed: ", std::strerror(errno));
  }
  rlimit tight = saved_;
  tight.rlim_cur = bytes;
  saved_handler_ = std::signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &tight) != 0) {
    std::signal(SIGXFSZ, saved_handler_);
    TANDEM_FAIL("FileSizeLimit: setrlimit(RLIMIT_FSIZE, ", bytes,
                ") failed: ", std::strerror(errno));
  }
}

FileSizeLimit::~FileSizeLimit() {
  setrlimit(RLIMIT_FSIZE, &saved_);
  std::signal(SIGXFSZ, saved_handler_);
}

}  // namespace testing
}  // namespace tandem
