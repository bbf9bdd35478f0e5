// comm's NCCL backend: broadcast and reduce between distinct physical GPUs, in one process: one
// communicator per device set (ncclCommInitAll), created on first use and cached. Each
// collective runs on the devices' communication side streams, ordered after the work
// already queued on their current streams and before work queued on them later (events),
// so that it can overlap compute that does not depend on it. Logical devices that share a
// GPU (TANDEM_CUDA_LOGICAL_DEVICES) are declined: NCCL refuses two ranks on one GPU, and
// comm.cc falls back to device copies. Each bucket goes as its dtype's NCCL type
// (nccl_types.h); under --config=cudasim, NCCL is the simulator's (tools/cudasim/README.md).
#include <nccl.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "parallel/internal/comm_backend.h"
#include "parallel/internal/nccl_types.h"
#include "tensor/cuda/cuda.h"
#include "tensor/runtime/stream.h"

namespace tandem::parallel::internal {
namespace {

#define TANDEM_NCCL_CHECK(call, what)                                                             \
  do {                                                                                            \
    const ncclResult_t result_ = (call);                                                          \
    TANDEM_CHECK(result_ == ncclSuccess, "NCCL ", what, " failed: ", ncclGetErrorString(result_), \
                 " (", ncclGetLastError(nullptr), ")");                                           \
  } while (false)

class NcclCommBackend final : public CommBackend {
 public:
  bool Supports(const std::vector<Device>& devices, DType dtype) const override {
    if (devices.size() < 2 || !HasNcclType(dtype)) return false;
    std::set<int> physical;
    for (Device d : devices) {
      if (!d.is_cuda() || d.index() >= cuda::DeviceCount()) return false;
      if (!physical.insert(cuda::PhysicalDevice(d.index())).second) return false;
    }
    return true;
  }

  void Broadcast(const std::vector<Tensor>& buffers, int root) override {
    const std::vector<Device> devices = DevicesOf(buffers);
    std::vector<ncclComm_t>& comms = CommsFor(devices);
    OnSideStreams(devices, [&](const std::vector<void*>& streams) {
      TANDEM_NCCL_CHECK(ncclGroupStart(), "group start");
      for (size_t i = 0; i < buffers.size(); ++i) {
        void* data = buffers[i].raw_data();
        TANDEM_NCCL_CHECK(ncclBroadcast(data, data, buffers[i].numel(),
                                        NcclType(buffers[i].dtype(), "comm broadcast"), root,
                                        comms[i], static_cast<cudaStream_t>(streams[i])),
                          "broadcast");
      }
      TANDEM_NCCL_CHECK(ncclGroupEnd(), "broadcast (group end)");
    });
  }

  void Reduce(const std::vector<Tensor>& inputs, const Tensor& output, int root) override {
    const std::vector<Device> devices = DevicesOf(inputs);
    std::vector<ncclComm_t>& comms = CommsFor(devices);
    // A sum of bools is their or (reduce_add's add), which is their max as bytes 0 and 1.
    const ncclRedOp_t op = output.dtype() == kBool ? ncclMax : ncclSum;
    OnSideStreams(devices, [&](const std::vector<void*>& streams) {
      TANDEM_NCCL_CHECK(ncclGroupStart(), "group start");
      for (size_t i = 0; i < inputs.size(); ++i) {
        void* receive = static_cast<int>(i) == root ? output.raw_data() : nullptr;
        TANDEM_NCCL_CHECK(ncclReduce(inputs[i].raw_data(), receive, inputs[i].numel(),
                                     NcclType(inputs[i].dtype(), "comm reduce"), op, root, comms[i],
                                     static_cast<cudaStream_t>(streams[i])),
                          "reduce");
      }
      TANDEM_NCCL_CHECK(ncclGroupEnd(), "reduce (group end)");
    });
  }

 private:
  static std::vector<Device> DevicesOf(const std::vector<Tensor>& tensors) {
    std::vector<Device> devices;
    for (const Tensor& t : tensors) devices.push_back(t.device());
    return devices;
  }

  // Runs `collective` on each device's side stream, fenced by events against the current
  // streams on both sides.
  template <typename F>
  static void OnSideStreams(const std::vector<Device>& devices, F&& collective) {
    std::vector<Stream> sides;
    std::vector<void*> handles;
    for (Device d : devices) {
      const Stream current = CurrentStream(d);
      const Stream side = SideStream(d);
      side.Wait(current);  // inputs produced on the compute stream are ready
      sides.push_back(side);
      handles.push_back(cuda::StreamHandle(side));
    }
    collective(handles);
    for (size_t i = 0; i < devices.size(); ++i) {
      CurrentStream(devices[i]).Wait(sides[i]);  // later work sees the results
    }
  }

  std::vector<ncclComm_t>& CommsFor(const std::vector<Device>& devices) {
    std::vector<int> ids;
    for (Device d : devices) ids.push_back(cuda::PhysicalDevice(d.index()));
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = comms_.find(ids);
    if (it != comms_.end()) return it->second;
    std::vector<ncclComm_t> comms(ids.size());
    TANDEM_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(ids.size()), ids.data()),
                      "communicator creation (ncclCommInitAll)");
    return comms_.emplace(ids, std::move(comms)).first->second;
  }

  std::mutex mutex_;
  // Never destroyed: communicators outlive every collective, and NCCL's teardown at process
  // exit may run after the CUDA context is gone.
  std::map<std::vector<int>, std::vector<ncclComm_t>> comms_;
};

struct Registration {
  Registration() { RegisterCommBackend(new NcclCommBackend); }
} registration;

}  // namespace
}  // namespace tandem::parallel::internal
