#include "parallel/distributed/process_group_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <utility>
#include <vector>

#include "parallel/internal/nccl_types.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/runtime/stream.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {
namespace {

ncclDataType_t NcclType(DType dtype) {
  return ::tandem::parallel::internal::NcclType(dtype, "ProcessGroupNccl");
}

std::string NcclMessage(ncclResult_t result) {
  const char* last = ncclGetLastError(nullptr);
  return std::string(ncclGetErrorString(result)) +
         (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : "");
}

}  // namespace

struct ProcessGroupNccl::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  std::string prefix;  // "ProcessGroupNccl rank 0 of 2 on cuda:0: "

  void Check(ncclResult_t result, const char* call, const std::string& what) const {
    TANDEM_CHECK(result == ncclSuccess, prefix, what, " failed: ", call, ": ", NcclMessage(result));
  }

  void CheckTensor(const Tensor& t, Device device, const char* collective, const char* role) const {
    TANDEM_CHECK(t.defined(), prefix, collective, ": the ", role, " tensor is undefined");
    TANDEM_CHECK(t.device() == device, prefix, collective, " takes tensors on ", device,
                 " (this group's device) but the ", role, " tensor is on ", t.device(),
                 "; move it there (or use ProcessGroupMpi for CPU tensors)");
    TANDEM_CHECK(t.numel() == 0 || t.is_contiguous(), prefix, collective, ": the ", role,
                 " tensor must be contiguous; call .contiguous() and copy the result back");
  }
};

ProcessGroupNccl::ProcessGroupNccl(Device device, std::shared_ptr<ProcessGroup> bootstrap)
    : ProcessGroupNccl(device, [&] {
        TANDEM_CHECK(device.is_cuda(), "ProcessGroupNccl needs a CUDA device but got ", device,
                     "; use ProcessGroupMpi for CPU tensors");
        TANDEM_CHECK(cuda::IsAvailable() && device.index() < cuda::DeviceCount(),
                     "ProcessGroupNccl: ", device, " is not available",
                     cuda::IsAvailable() ? "" : ": ", cuda::UnavailableReason());
        auto impl = std::make_unique<Impl>();
        impl->rank = bootstrap ? bootstrap->rank() : 0;
        impl->size = bootstrap ? bootstrap->size() : 1;
        impl->prefix = tandem::internal::Concat("ProcessGroupNccl rank ", impl->rank, " of ",
                                                impl->size, " on ", device, ": ");
        // Rank 0's unique id reaches every rank through the bootstrap group (as int64s).
        ncclUniqueId id;
        std::memset(&id, 0, sizeof(id));
        if (impl->rank == 0) impl->Check(ncclGetUniqueId(&id), "ncclGetUniqueId", "setup");
        if (bootstrap && impl->size > 1) {
          constexpr int64_t kWords = (sizeof(ncclUniqueId) + 7) / 8;
          std::vector<int64_t> words(kWords, 0);
          std::memcpy(words.data(), &id, sizeof(id));
          Tensor packed = from_vector(words, {kWords});
          bootstrap->broadcast(packed, 0)->wait();
          words = packed.to_vector<int64_t>();
          std::memcpy(&id, words.data(), sizeof(id));
        }
        const cudaError_t set = cudaSetDevice(cuda::PhysicalDevice(device.index()));
        TANDEM_CHECK(set == cudaSuccess, impl->prefix,
                     "cudaSetDevice failed: ", cudaGetErrorString(set));
        impl->Check(ncclCommInitRank(&impl->comm, impl->size, id, impl->rank), "ncclCommInitRank",
                    "communicator creation");
        return impl;
      }()) {}

ProcessGroupNccl::ProcessGroupNccl(Device device, std::unique_ptr<Impl> impl)
    : ProcessGroup(impl->rank, impl->size), device_(device), impl_(std::move(impl)) {}

ProcessGroupNccl::~ProcessGroupNccl() {
  if (impl_->comm != nullptr) {
    cuda::Synchronize(device_.index());
    ncclCommDestroy(impl_->comm);
  }
}

namespace {

// Runs `collective(stream)` on the device's side stream, ordered after the current stream's
// work so far and before its later work.
template <typename F>
void OnSideStream(Device device, F&& collective) {
  const Stream current = CurrentStream(device);
  const Stream side = SideStream(device);
  side.Wait(current);
  collective(static_cast<cudaStream_t>(cuda::StreamHandle(side)), side);
  current.Wait(side);
}

std::shared_ptr<Work> Completed(std::string description) {
  auto work = std::make_shared<Work>(std::move(description));
  work->Start();
  work->Finish();
  return work;
}

}  // namespace

std::shared_ptr<Work> ProcessGroupNccl::allreduce(Tensor tensor, ReduceOp op) {
  impl_->CheckTensor(tensor, device_, "allreduce", "");
  const std::string what = tandem::internal::Concat(
      "allreduce (", ReduceOpName(op), ") of ", tensor.numel(), " ", tensor.dtype(), " elements");
  TANDEM_CHECK(tensor.dtype() != kBool, impl_->prefix,
               "allreduce of bool tensors is not defined; convert to uint8 or int32 first");
  // NCCL's bfloat16 and float16 sums add in float32 but round each partial sum of its ring.
  TANDEM_CHECK(op != ReduceOp::kAverage || IsFloatingPoint(tensor.dtype()), impl_->prefix,
               "allreduce: average is defined for floating-point tensors but this one is ",
               tensor.dtype(), "; use ReduceOp::kSum");
  if (tensor.numel() > 0) {
    OnSideStream(device_, [&](cudaStream_t stream, Stream side) {
      impl_->Check(ncclAllReduce(tensor.raw_data(), tensor.raw_data(),
                                 static_cast<size_t>(tensor.numel()), NcclType(tensor.dtype()),
                                 op == ReduceOp::kSum ? ncclSum : ncclAvg, impl_->comm, stream),
                   "ncclAllReduce", what);
      RecordStream(tensor, side);
    });
  }
  return Completed(what);
}

std::shared_ptr<Work> ProcessGroupNccl::broadcast(Tensor tensor, int root) {
  impl_->CheckTensor(tensor, device_, "broadcast", "");
  TANDEM_CHECK(root >= 0 && root < size(), impl_->prefix, "broadcast: root must be a rank in [0, ",
               size(), ") but is ", root);
  const std::string what = tandem::internal::Concat(
      "broadcast from rank ", root, " of ", tensor.numel(), " ", tensor.dtype(), " elements");
  if (tensor.numel() > 0) {
    OnSideStream(device_, [&](cudaStream_t stream, Stream side) {
      impl_->Check(
          ncclBroadcast(tensor.raw_data(), tensor.raw_data(), static_cast<size_t>(tensor.numel()),
                        NcclType(tensor.dtype()), root, impl_->comm, stream),
          "ncclBroadcast", what);
      RecordStream(tensor, side);
    });
  }
  return Completed(what);
}

std::shared_ptr<Work> ProcessGroupNccl::allgather(Tensor output, Tensor input) {
  impl_->CheckTensor(input, device_, "allgather", "input");
  impl_->CheckTensor(output, device_, "allgather", "output");
  TANDEM_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * size(),
               impl_->prefix, "allgather: the output must hold ", size(), " x ", input.numel(), " ",
               input.dtype(), " elements (world size x input) but holds ", output.numel(), " ",
               output.dtype(), " elements");
  const std::string what =
      tandem::internal::Concat("allgather of ", input.numel(), " ", input.dtype(), " elements");
  if (input.numel() > 0) {
    OnSideStream(device_, [&](cudaStream_t stream, Stream side) {
      impl_->Check(
          ncclAllGather(input.raw_data(), output.raw_data(), static_cast<size_t>(input.numel()),
                        NcclType(input.dtype()), impl_->comm, stream),
          "ncclAllGather", what);
      RecordStream(input, side);
      RecordStream(output, side);
    });
  }
  return Completed(what);
}

std::shared_ptr<Work> ProcessGroupNccl::barrier() {
  Tensor one = ones({1}, TensorOptions().device(device_));
  allreduce(one);
  cuda::Synchronize(device_.index());
  return Completed("barrier");
}

}  // namespace tandem::parallel::distributed
