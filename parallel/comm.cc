#include "parallel/comm.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "parallel/internal/comm_backend.h"
#include "tensor/core/autograd.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/run_across_devices.h"

namespace tandem::parallel {
namespace {

// Below this many elements a CPU reduce-add runs on the calling thread alone.
constexpr int64_t kSplitThreshold = 1 << 16;
// A split reduce-add hands out pieces of about this many elements, first come first served:
// the thread whose cache holds the summed-into copy adds faster than the others (they must
// fetch its lines), and takes more pieces instead of waiting for them at the end.
constexpr int64_t kReducePieceElements = 1 << 15;

void CheckDevices(const std::vector<Device>& devices, const char* op) {
  TANDEM_CHECK(!devices.empty(), op,
               ": expected at least one device but got an empty list; pass e.g. {cpu:0, cpu:1}");
}

// `tensor` on `device`: itself if it is there, a shared-memory view between CPU devices,
// else a copy. Records nothing.
Tensor MoveTo(const Tensor& tensor, Device device) {
  if (tensor.device() == device) return tensor;
  if (tensor.device().is_cpu() && device.is_cpu()) return alias_on_cpu_device(tensor, device);
  return tensor.detach().to(device);
}

// Groups of tensor indices, one dtype per group, each of at most `buffer_bytes` (a tensor
// larger than that gets a group of its own).
std::vector<std::vector<size_t>> Buckets(const std::vector<Tensor>& tensors, size_t buffer_bytes) {
  std::map<DType, std::vector<size_t>> open;
  std::map<DType, size_t> open_bytes;
  std::vector<std::vector<size_t>> buckets;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DType dtype = tensors[i].dtype();
    const size_t bytes = static_cast<size_t>(tensors[i].numel()) * ElementSize(dtype);
    if (!open[dtype].empty() && open_bytes[dtype] + bytes > buffer_bytes) {
      buckets.push_back(std::move(open[dtype]));
      open[dtype].clear();
      open_bytes[dtype] = 0;
    }
    open[dtype].push_back(i);
    open_bytes[dtype] += bytes;
  }
  for (auto& [dtype, bucket] : open) {
    if (!bucket.empty()) buckets.push_back(std::move(bucket));
  }
  return buckets;
}

int64_t TotalElements(const std::vector<Tensor>& tensors, const std::vector<size_t>& bucket) {
  int64_t total = 0;
  for (size_t i : bucket) total += tensors[i].numel();
  return total;
}

// The bucket's tensors packed into one flat contiguous tensor on their device.
Tensor Flatten(const std::vector<Tensor>& tensors, const std::vector<size_t>& bucket) {
  const Tensor& first = tensors[bucket.front()];
  Tensor flat = empty({TotalElements(tensors, bucket)},
                      TensorOptions().dtype(first.dtype()).device(first.device()));
  int64_t offset = 0;
  for (size_t i : bucket) {
    const int64_t n = tensors[i].numel();
    if (n > 0) flat.narrow(0, offset, n).view(tensors[i].shape()).copy_(tensors[i]);
    offset += n;
  }
  return flat;
}

// Views of `flat` shaped like the bucket's tensors, stored into out[i].
void Unflatten(const Tensor& flat, const std::vector<Tensor>& like,
               const std::vector<size_t>& bucket, std::vector<Tensor>& out) {
  int64_t offset = 0;
  for (size_t i : bucket) {
    const int64_t n = like[i].numel();
    out[i] = flat.narrow(0, offset, n).view(like[i].shape());
    offset += n;
  }
}

// out[j] = the sum of inputs[k][j] over k, for j in [begin, end), vectorised, in blocks that
// stay in the L1 cache from the copy to the last addition.
template <typename T>
void SumRange(const std::vector<const T*>& inputs, T* out, int64_t begin, int64_t end) {
  constexpr int64_t kBlock = 2048;
  for (int64_t block = begin; block < end; block += kBlock) {
    const int64_t n = std::min(kBlock, end - block);
    if (out != inputs[0]) {
      std::memcpy(out + block, inputs[0] + block, static_cast<size_t>(n) * sizeof(T));
    }
    for (size_t k = 1; k < inputs.size(); ++k) {
      ::tandem::vec::AddInto(out + block, inputs[k] + block, n);
    }
  }
}

// One sum for ReduceAddOnCpu: `out` (contiguous) = the sum of `inputs` (contiguous, same
// shape and dtype).
struct CpuSum {
  std::vector<Tensor> inputs;
  Tensor out;
};

template <typename T>
void SumPart(const CpuSum& sum, int64_t begin, int64_t end) {
  std::vector<const T*> sources;
  for (const Tensor& t : sum.inputs) sources.push_back(static_cast<const T*>(t.raw_data()));
  SumRange<T>(sources, static_cast<T*>(sum.out.raw_data()), begin, end);
}

// Computes every sum, their elements laid end to end and split evenly over the workers of the
// CPU devices that hold the inputs: one hand-off for a whole model's gradients, and small
// tensors shared out as well as large ones.
void ReduceAddOnCpu(const std::vector<CpuSum>& sums) {
  std::vector<Device> helpers;
  std::set<Device> seen;
  std::vector<int64_t> starts = {0};  // sums[k] covers [starts[k], starts[k + 1])
  for (const CpuSum& sum : sums) {
    for (const Tensor& t : sum.inputs) {
      if (seen.insert(t.device()).second) helpers.push_back(t.device());
    }
    starts.push_back(starts.back() + sum.out.numel());
  }
  const int64_t total = starts.back();
  const int pieces = total < kSplitThreshold
                         ? 1
                         : static_cast<int>(std::max<int64_t>(
                               static_cast<int64_t>(helpers.size()),
                               (total + kReducePieceElements - 1) / kReducePieceElements));
  RunAcrossDevices(helpers, pieces, [&](int piece) {
    const int64_t begin = total * piece / pieces, end = total * (piece + 1) / pieces;
    for (size_t k = 0; k < sums.size(); ++k) {
      const int64_t from = std::max(begin, starts[k]) - starts[k];
      const int64_t to = std::min(end, starts[k + 1]) - starts[k];
      if (from >= to) continue;
      DispatchDType(sums[k].out.dtype(), "reduce_add",
                    [&](auto tag) { SumPart<typename decltype(tag)::type>(sums[k], from, to); });
    }
  });
}

}  // namespace

std::vector<int64_t> ChunkSizes(int64_t size, int64_t chunks) {
  TANDEM_CHECK(chunks > 0, "ChunkSizes: the number of chunks must be positive but is ", chunks);
  TANDEM_CHECK(size >= 0, "ChunkSizes: the size must be >= 0 but is ", size);
  if (size == 0) return {0};
  const int64_t piece = (size + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += piece)
    sizes.push_back(std::min(piece, size - start));
  return sizes;
}

std::vector<Tensor> broadcast(const Tensor& tensor, const std::vector<Device>& devices) {
  TANDEM_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
  std::vector<std::vector<Tensor>> copies = broadcast_coalesced({tensor}, devices);
  std::vector<Tensor> out;
  for (auto& per_device : copies) out.push_back(std::move(per_device[0]));
  return out;
}

std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices,
                                                     size_t buffer_bytes) {
  CheckDevices(devices, "broadcast_coalesced");
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> out(devices.size(), std::vector<Tensor>(tensors.size()));
  if (tensors.empty()) return out;
  const Device source = tensors[0].device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK(tensors[i].defined(), "broadcast_coalesced: tensor ", i, " is undefined");
    TANDEM_CHECK(tensors[i].device() == source, "broadcast_coalesced: every tensor must be on ",
                 source, " (where tensor 0 is) but tensor ", i, " is on ", tensors[i].device(),
                 "; move it there first");
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    const Device target = devices[d];
    if (target == source) {
      out[d] = tensors;
    } else if (source.is_cpu() && target.is_cpu()) {
      for (size_t i = 0; i < tensors.size(); ++i)
        out[d][i] = alias_on_cpu_device(tensors[i], target);
    }
  }
  // Accelerators: one flat buffer per bucket, sent once per device: by the comm backend
  // (NCCL) when it serves these devices, else by a device copy each.
  std::vector<size_t> pending;  // devices still without copies
  std::vector<Device> group = {source};
  for (size_t d = 0; d < devices.size(); ++d) {
    if (out[d][0].defined()) continue;
    pending.push_back(d);
    if (std::find(group.begin(), group.end(), devices[d]) == group.end()) {
      group.push_back(devices[d]);
    }
  }
  if (pending.empty()) return out;
  std::vector<Tensor> contiguous;  // only where a flat buffer is packed
  for (const Tensor& t : tensors) contiguous.push_back(t.contiguous());
  internal::CommBackend* backend = internal::GetCommBackend();
  for (const std::vector<size_t>& bucket : Buckets(contiguous, buffer_bytes)) {
    Tensor flat = Flatten(contiguous, bucket);
    std::map<Device, Tensor> received;
    if (backend != nullptr && backend->Supports(group, flat.dtype())) {
      std::vector<Tensor> buffers = {flat};
      for (size_t g = 1; g < group.size(); ++g) {
        buffers.push_back(
            empty(flat.shape(), TensorOptions().dtype(flat.dtype()).device(group[g])));
        received[group[g]] = buffers.back();
      }
      backend->Broadcast(buffers, /*root=*/0);
    }
    for (size_t d : pending) {
      auto it = received.find(devices[d]);
      if (it == received.end()) it = received.emplace(devices[d], flat.to(devices[d])).first;
      Unflatten(it->second, contiguous, bucket, out[d]);
    }
  }
  return out;
}

Tensor reduce_add(const std::vector<Tensor>& tensors, Device destination) {
  TANDEM_CHECK(!tensors.empty(), "reduce_add: expected at least one tensor but got none");
  NoGradGuard no_grad;
  const Tensor& first = tensors[0];
  TANDEM_CHECK(first.defined(), "reduce_add: tensor 0 is undefined");
  bool all_cpu = destination.is_cpu();
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK(tensors[i].defined(), "reduce_add: tensor ", i, " is undefined");
    TANDEM_CHECK(tensors[i].shape() == first.shape() && tensors[i].dtype() == first.dtype(),
                 "reduce_add: every tensor must have tensor 0's shape ",
                 ShapeToString(first.shape()), " and dtype ", DTypeName(first.dtype()),
                 " but tensor ", i, " (on ", tensors[i].device(), ") has ",
                 ShapeToString(tensors[i].shape()), " and ", DTypeName(tensors[i].dtype()));
    all_cpu = all_cpu && tensors[i].device().is_cpu();
  }
  if (all_cpu) {
    CpuSum sum;
    for (const Tensor& t : tensors) sum.inputs.push_back(t.contiguous());
    sum.out = empty(first.shape(), TensorOptions().dtype(first.dtype()).device(destination));
    ReduceAddOnCpu({sum});
    return sum.out;
  }
  // Start from the copy already on the destination, if any, and add the others into it.
  size_t start = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].device() == destination) {
      start = i;
      break;
    }
  }
  Tensor out = tensors[start].detach().to(destination).clone();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i != start) out.add_(MoveTo(tensors[i], destination));
  }
  return out;
}

std::vector<Tensor> reduce_add_coalesced(std::vector<std::vector<Tensor>> per_device,
                                         Device destination, size_t buffer_bytes) {
  TANDEM_CHECK(!per_device.empty(),
               "reduce_add_coalesced: expected tensors from at least one device but got none");
  NoGradGuard no_grad;
  const size_t count = per_device[0].size();
  bool all_cpu = destination.is_cpu();
  for (size_t d = 0; d < per_device.size(); ++d) {
    TANDEM_CHECK(per_device[d].size() == count, "reduce_add_coalesced: device ", d, " has ",
                 per_device[d].size(), " tensors but device 0 has ", count,
                 "; every device must contribute the same list");
    for (size_t i = 0; i < count; ++i) {
      TANDEM_CHECK(per_device[d][i].defined(), "reduce_add_coalesced: tensor ", i, " of device ", d,
                   " is undefined");
      all_cpu = all_cpu && per_device[d][i].device().is_cpu();
    }
  }
  std::vector<Tensor> out(count);
  if (all_cpu) {
    // No copies to save: every tensor summed where it is, all in one split over the workers.
    // A copy on the destination that the caller gave up (moved in) and nothing else holds is
    // summed into in place: one buffer and one pass over memory fewer.
    std::vector<CpuSum> sums(count);
    for (size_t i = 0; i < count; ++i) {
      // Device 0's tensor described by value: a handle on it would keep it from being reused.
      const Shape shape = per_device[0][i].shape();
      const DType dtype = per_device[0][i].dtype();
      const Device first_device = per_device[0][i].device();
      for (auto& tensors : per_device) {
        Tensor t = std::move(tensors[i]);
        TANDEM_CHECK(t.shape() == shape && t.dtype() == dtype, "reduce_add_coalesced: tensor ", i,
                     " must have the same shape and dtype on every device, but it is ",
                     ShapeToString(shape), " ", DTypeName(dtype), " on ", first_device, " and ",
                     ShapeToString(t.shape()), " ", DTypeName(t.dtype()), " on ", t.device());
        if (!sums[i].out.defined() && t.device() == destination && IsSoleOwner(t)) {
          sums[i].out = t;
          sums[i].inputs.insert(sums[i].inputs.begin(), std::move(t));  // summed first
        } else {
          sums[i].inputs.push_back(t.contiguous());
        }
      }
      if (!sums[i].out.defined()) {
        sums[i].out = empty(shape, TensorOptions().dtype(dtype).device(destination));
      }
      out[i] = sums[i].out;
    }
    ReduceAddOnCpu(sums);
    return out;
  }
  // Accelerators: per bucket, one flat buffer per device, summed onto the destination by
  // the comm backend (NCCL) when it serves these devices, else by copies and adds.
  std::vector<Device> group;
  int root = -1;
  for (size_t d = 0; d < per_device.size(); ++d) {
    const Device device = count > 0 ? per_device[d][0].device() : destination;
    if (device == destination) root = static_cast<int>(d);
    group.push_back(device);
  }
  internal::CommBackend* backend = internal::GetCommBackend();
  for (const std::vector<size_t>& bucket : Buckets(per_device[0], buffer_bytes)) {
    std::vector<Tensor> flats;
    for (const auto& tensors : per_device) {
      std::vector<Tensor> contiguous;
      for (const Tensor& t : tensors) contiguous.push_back(t.contiguous());
      flats.push_back(Flatten(contiguous, bucket));
    }
    Tensor sum;
    if (root >= 0 && backend != nullptr && backend->Supports(group, flats[root].dtype())) {
      sum = empty(flats[root].shape(),
                  TensorOptions().dtype(flats[root].dtype()).device(destination));
      backend->Reduce(flats, sum, root);
    } else {
      sum = reduce_add(flats, destination);
    }
    Unflatten(sum, per_device[0], bucket, out);
  }
  return out;
}

std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes, int64_t dim) {
  CheckDevices(devices, "scatter");
  TANDEM_CHECK(tensor.defined(), "scatter: the tensor is undefined");
  TANDEM_CHECK(tensor.dim() > 0,
               "scatter: cannot split a 0-dimensional tensor; give it a batch dimension first");
  NoGradGuard no_grad;
  const int64_t axis = WrapDim(dim, tensor.dim(), "scatter");
  std::vector<Tensor> pieces;
  if (chunk_sizes.empty()) {
    pieces = tensor.chunk(static_cast<int64_t>(devices.size()), axis);
  } else {
    TANDEM_CHECK(chunk_sizes.size() == devices.size(),
                 "scatter: expected one chunk size per "
                 "device (",
                 devices.size(), ") but got ", chunk_sizes.size());
    int64_t total = 0;
    for (int64_t s : chunk_sizes) {
      TANDEM_CHECK(s >= 0, "scatter: chunk sizes must be >= 0 but one is ", s);
      total += s;
    }
    TANDEM_CHECK(total == tensor.size(axis), "scatter: the chunk sizes add up to ", total,
                 " but the tensor has ", tensor.size(axis), " along dimension ", axis,
                 "; they must add up exactly");
    pieces = tensor.split_with_sizes(chunk_sizes, axis);
  }
  for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = MoveTo(pieces[i].detach(), devices[i]);
  return pieces;
}

Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim) {
  TANDEM_CHECK(!tensors.empty(), "gather: expected at least one tensor but got none");
  NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK(tensors[i].defined(), "gather: tensor ", i, " is undefined");
  }
  const bool scalars =
      std::all_of(tensors.begin(), tensors.end(), [](const Tensor& t) { return t.dim() == 0; });
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) parts.push_back(scalars ? t.detach().view({1}) : t.detach());
  if (scalars) dim = 0;
  const Tensor& first = parts[0];
  TANDEM_CHECK(first.dim() > 0,
               "gather: cannot gather 0-dimensional tensors together with "
               "tensors of other ranks");
  const int64_t axis = WrapDim(dim, first.dim(), "gather");
  Shape shape = first.shape();
  shape[axis] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    Shape expected = first.shape();
    Shape found = parts[i].shape();
    TANDEM_CHECK(found.size() == expected.size() && parts[i].dtype() == first.dtype(),
                 "gather: tensor ", i, " is ", ShapeToString(found), " ",
                 DTypeName(parts[i].dtype()), " but tensor 0 is ", ShapeToString(expected), " ",
                 DTypeName(first.dtype()), "; all must have the same rank and dtype");
    expected[axis] = found[axis];
    TANDEM_CHECK(found == expected, "gather: tensor ", i, " has shape ", ShapeToString(found),
                 " but must match tensor 0's ", ShapeToString(first.shape()),
                 " in every dimension except ", axis);
    shape[axis] += found[axis];
  }
  Tensor out = empty(shape, TensorOptions().dtype(first.dtype()).device(destination));
  int64_t offset = 0;
  for (const Tensor& part : parts) {
    const int64_t n = part.size(axis);
    if (n > 0) out.narrow(axis, offset, n).copy_(MoveTo(part, destination));
    offset += n;
  }
  return out;
}

}  // namespace tandem::parallel
