#include "parallel/parallel_apply.h"

#include <cxxabi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <typeinfo>

#include "tensor/runtime/profiler.h"
#include "tensor/runtime/threads.h"

namespace tandem::parallel {
namespace {

std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  return result;
}

// Rethrows `error` as a tandem::Error naming the replica, with the original nested.
[[noreturn]] void ThrowFromReplica(std::exception_ptr error, size_t replica, Device device) {
  std::string type = "unknown exception";
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    type = Demangle(typeid(e).name());
    what = e.what();
  } catch (...) {
  }
  try {
    std::rethrow_exception(error);
  } catch (...) {
    std::throw_with_nested(Error("Caught " + type + " in replica " + std::to_string(replica) +
                                 " on device " + device.ToString() + ": " + what));
  }
}

bool IsPeerFailure(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerReplicaFailed&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::vector<std::vector<Tensor>> ParallelRun(
    const std::vector<Device>& devices,
    const std::function<std::vector<Tensor>(size_t replica)>& work) {
  const size_t n = devices.size();
  std::vector<std::vector<Tensor>> outputs(n);
  std::vector<std::exception_ptr> errors(n);
  if (n == 1) {
    try {
      outputs[0] = work(0);
    } catch (...) {
      ThrowFromReplica(std::current_exception(), 0, devices[0]);
    }
    return outputs;
  }
  std::vector<std::future<void>> pending(n);
  std::vector<size_t> inline_replicas;
  std::atomic<size_t> finished{0};  // replicas done on other threads
  size_t submitted = 0;
  for (size_t i = 0; i < n; ++i) {
    DeviceWorker& worker = DeviceWorker::For(devices[i]);
    auto run = [&, i] {
      try {
        TANDEM_PROFILE_SCOPE("parallel",
                             "replica " + std::to_string(i) + " on " + devices[i].ToString());
        outputs[i] = work(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      finished.fetch_add(1, std::memory_order_release);
    };
    if (inline_replicas.empty() && RunsInline(devices[i])) {
      inline_replicas.push_back(i);
    } else {
      pending[i] = worker.Submit(run);
      ++submitted;
    }
  }
  for (size_t i : inline_replicas) {
    WorkerScope as_worker(&DeviceWorker::For(devices[i]));
    try {
      TANDEM_PROFILE_SCOPE("parallel",
                           "replica " + std::to_string(i) + " on " + devices[i].ToString());
      outputs[i] = work(i);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  // Replicas of equal chunks finish close together: look for the others before sleeping.
  SpinWait([&] { return finished.load(std::memory_order_acquire) == submitted; }, kHandOffSpin);
  for (auto& f : pending) {
    if (f.valid()) f.wait();  // every replica stops before anything is rethrown
  }
  std::optional<size_t> failed;
  for (size_t i = 0; i < n && !failed; ++i) {
    if (errors[i] && !IsPeerFailure(errors[i])) failed = i;
  }
  for (size_t i = 0; i < n && !failed; ++i) {
    if (errors[i]) failed = i;
  }
  if (failed) ThrowFromReplica(errors[*failed], *failed, devices[*failed]);
  return outputs;
}

std::vector<std::vector<Tensor>> parallel_apply(
    const std::vector<std::shared_ptr<nn::Module>>& modules,
    const std::vector<std::vector<Tensor>>& inputs, const std::vector<Device>& devices) {
  TANDEM_CHECK(modules.size() == inputs.size(),
               "parallel_apply: expected one input list per "
               "module but got ",
               modules.size(), " modules and ", inputs.size(), " input lists");
  TANDEM_CHECK(devices.empty() || devices.size() == modules.size(),
               "parallel_apply: expected one device per module but got ", modules.size(),
               " modules and ", devices.size(), " devices");
  TANDEM_CHECK(!modules.empty(), "parallel_apply: expected at least one module but got none");
  std::vector<Device> targets = devices;
  if (targets.empty()) {
    for (size_t i = 0; i < modules.size(); ++i) {
      TANDEM_CHECK(modules[i] != nullptr, "parallel_apply: module ", i, " is null");
      if (!inputs[i].empty() && inputs[i][0].defined()) {
        targets.push_back(inputs[i][0].device());
      } else {
        std::vector<Tensor> params = modules[i]->parameters();
        targets.push_back(params.empty() ? Device::Cpu(0) : params[0].device());
      }
    }
  }
  for (size_t i = 0; i < modules.size(); ++i) {
    TANDEM_CHECK(modules[i] != nullptr, "parallel_apply: module ", i, " is null");
  }
  return ParallelRun(targets, [&](size_t i) { return modules[i]->forward_tensors(inputs[i]); });
}

}  // namespace tandem::parallel
