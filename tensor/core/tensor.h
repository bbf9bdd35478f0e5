// Tensor: a dense, strided, n-dimensional array of any dtype of tensor/base/dtype.h (float32,
// float64, bfloat16, float16, int64, int32, uint8, bool) on a CPU or CUDA device, with
// define-by-run autograd. A Tensor is a cheap handle to a shared implementation (storage + offset +
// shape + strides); copying a Tensor shares the data. Views (view/reshape, narrow, chunk, split,
// transpose, expand, ...) share storage with their source; `to(device)` returns a new tensor and
// never changes the source.
//
//   using namespace tandem;
//   Tensor w = randn({784, 10}, TensorOptions().requires_grad(true));
//   Tensor x = rand({32, 784});
//   Tensor loss = matmul(x, w).relu().sum();
//   loss.backward();            // w.grad() now holds d loss / d w
//   Tensor y = x.to(Device::Parse("cpu:1"));   // x itself stays on cpu:0
//
// This is the handle's own header, for the layers inside tensor/; users include the umbrella
// tensor/tensor.h, which adds the operations (tensor/ops/ops.h). Factories and random numbers
// are below.
#ifndef TANDEM_TENSOR_CORE_TENSOR_H_
#define TANDEM_TENSOR_CORE_TENSOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/base/error.h"
#include "tensor/runtime/devices.h"  // IWYU pragma: export (device counts, CheckAvailable)
#include "tensor/runtime/stream.h"   // IWYU pragma: export (Stream, for RecordStream)

namespace tandem {

using Shape = std::vector<int64_t>;
std::string ShapeToString(const Shape& shape);  // "[2, 3]"
int64_t NumElements(const Shape& shape);

class Node;  // tensor/core/autograd.h
struct TensorImpl;

// Where a new tensor goes and how it is made.
struct TensorOptions {
  std::optional<DType> dtype_;  // unset: float32, or what the factory implies (arange: int64)
  Device device_ = Device::Cpu(0);
  bool requires_grad_ = false;
  bool pinned_ = false;  // page-locked host memory (CPU tensors, CUDA builds only)

  TensorOptions() = default;
  TensorOptions(Device d) : device_(d) {}  // NOLINT: lets a Device stand for options.
  TensorOptions(DType t) : dtype_(t) {}    // NOLINT: lets a DType stand for options.
  TensorOptions& dtype(DType t) {
    dtype_ = t;
    return *this;
  }
  TensorOptions& device(Device d) {
    device_ = d;
    return *this;
  }
  TensorOptions& requires_grad(bool r) {
    requires_grad_ = r;
    return *this;
  }
  TensorOptions& pinned(bool p) {
    pinned_ = p;
    return *this;
  }
};

class Tensor {
 public:
  // An undefined tensor (defined() is false), as a default value or "no gradient".
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }

  // ---- Metadata ------------------------------------------------------------------------
  const Shape& shape() const;
  const std::vector<int64_t>& strides() const;  // in elements
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  int64_t storage_offset() const;  // in elements
  bool is_contiguous() const;
  bool is_pinned() const;
  // True if both tensors view the same storage.
  bool shares_storage_with(const Tensor& other) const;

  // ---- Data access (copies to the host when needed; waits for the device) -------------
  // T must be dtype()'s C++ type: float, double, int64_t, BFloat16, Half, bool, int32_t,
  // uint8_t (tensor/base/dtype.h's table).
  template <typename T>
  std::vector<T> to_vector() const;
  // The single value of a one-element tensor of any dtype, as a double (exact for every
  // dtype but int64 beyond 2^53; bool gives 0 or 1).
  double item() const;
  // The value converted to T as C++ converts the stored element (int64 stays exact).
  //   bool flag = any(mask).item<bool>();
  template <typename T>
  T item() const;
  // Raw pointer to the first element (host memory for CPU tensors, device memory else).
  void* raw_data() const;
  template <typename T>
  T* data() const;  // checks dtype
  // libtorch's names: the address of the first element (storage offset included; host
  // memory for CPU tensors, device memory else). The typed form checks that T is the
  // tensor's dtype (float, double, int64_t, BFloat16, Half, bool, int32_t, uint8_t) and throws
  // saying which it is.
  //   float* p = x.data_ptr<float>();   // x.dtype() == kFloat32
  void* data_ptr() const { return raw_data(); }
  template <typename T>
  T* data_ptr() const;

  // ---- Views (share storage; differentiable) -------------------------------------------
  // New shape with the same number of elements; one dimension may be -1. view() requires
  // compatible strides, reshape() copies when it must.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  // torch.chunk: split size ceil(n / chunks), so fewer than `chunks` pieces may come back.
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  // Pieces of `split_size` along dim (the last may be smaller).
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  // Pieces of the given sizes, which must add up to size(dim).
  std::vector<Tensor> split_with_sizes(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  // Broadcasts size-1 dimensions (stride 0) to `shape`; may add leading dimensions.
  Tensor expand(const Shape& shape) const;
  // This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const;

  // ---- Copies --------------------------------------------------------------------------
  // A new tensor on `device` (this tensor if it is already there, as in PyTorch).
  // Differentiable: the gradient flows back to this tensor's device.
  Tensor to(Device device) const;
  // A copy converted to `dtype` (this tensor if it already has it), between any two dtypes as
  // PyTorch converts: floating to integral truncates toward zero, anything to bool is
  // `!= 0` (NaN is true), bool to a number is 0 or 1, to a 16-bit float rounds to nearest even.
  // Differentiable between floating dtypes: the gradient comes back converted to this
  // tensor's dtype (a bfloat16 model's float32 loss sends bfloat16 gradients).
  Tensor to(DType dtype) const;
  // A copy in pinned host memory (CPU tensors; needs a CUDA build with a GPU).
  Tensor pin_memory() const;
  Tensor clone() const;  // differentiable deep copy
  // A tensor sharing data with this one but outside the autograd graph.
  Tensor detach() const;

  // ---- In-place (not recorded by autograd: use under NoGradGuard or on tensors that do
  // not require grad) ----------------------------------------------------------------
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);  // src broadcast to this shape; any devices
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // this += alpha * other
  Tensor& sub_(const Tensor& other) { return add_(other, -1.0); }
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double scalar);
  Tensor& div_(const Tensor& other);
  Tensor& add_(double scalar);

  // ---- Autograd ----------------------------------------------------------------------
  bool requires_grad() const;
  // Marks a leaf tensor as a parameter whose gradient is accumulated.
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  // The accumulated gradient of a leaf (undefined until a backward pass reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  // Back-propagates from this tensor. `gradient` defaults to ones for a one-element
  // tensor and must be given otherwise. Each device's part of the graph runs on that
  // device's worker, so replicas on different devices run in parallel. With
  // `create_graph` the gradients (and .grad) carry a graph of their own, for a second
  // derivative; a .grad that holds the graph of its own leaf is a reference cycle, as in
  // PyTorch, so prefer autograd::grad there (tensor/core/autograd.h). Each node frees its
  // saved tensors once it has run, unless `retain_graph` (default: create_graph, as PyTorch):
  // a second backward through the same graph needs retain_graph=true in the first.
  void backward(const Tensor& gradient = Tensor(), bool create_graph = false,
                std::optional<bool> retain_graph = std::nullopt) const;
  const std::shared_ptr<Node>& grad_fn() const;

  // ---- Common ops as methods (see ops.h) -----------------------------------------------
  Tensor relu() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;

  // "tensor([[1.0000, 2.0000], ...], device='cpu:1')", PyTorch's format: floating values with
  // 4 decimals, bool as True/False; the dtype is named unless the values imply it (float32,
  // int64, bool): "tensor([1.0000, 2.5000], dtype=bfloat16)", "tensor([1, 2], dtype=uint8)".
  std::string ToString() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  void CheckDefined(const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

template <typename T>
T Tensor::item() const {
  TANDEM_CHECK(numel() == 1, "item() needs a tensor with exactly one element but got shape ",
               ShapeToString(shape()));
  return DispatchDType(dtype(), "item", [&](auto tag) {
    using Stored = typename decltype(tag)::type;
    const Stored value = to_vector<Stored>()[0];
    return static_cast<T>(value);
  });
}

// ---- Factories -----------------------------------------------------------------------
Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
// 0, 1, ..., n-1 (int64 unless options name a dtype; n must fit the dtype for integers).
Tensor arange(int64_t n, const TensorOptions& options = {});
// From host values (row-major); values.size() must equal the shape's element count. The
// tensor has the values' dtype unless options name another, to which they are converted as
// to(dtype) converts.
//   Tensor pixels = from_vector(std::vector<uint8_t>{0, 255}, {2});          // uint8
//   Tensor mask = from_vector(std::vector<bool>{true, false}, {2});          // bool
//   Tensor h = from_vector(std::vector<float>{0.1f}, {1}, kBFloat16);        // rounded once
Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                   const TensorOptions& options = {});
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                   const TensorOptions& options = {});
Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                   const TensorOptions& options = {});
Tensor from_vector(const std::vector<BFloat16>& values, const Shape& shape,
                   const TensorOptions& options = {});
Tensor from_vector(const std::vector<Half>& values, const Shape& shape,
                   const TensorOptions& options = {});
Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape,
                   const TensorOptions& options = {});
Tensor from_vector(const std::vector<uint8_t>& values, const Shape& shape,
                   const TensorOptions& options = {});
// std::vector<bool> packs bits, so it has an overload of its own (a bool tensor).
Tensor from_vector(const std::vector<bool>& values, const Shape& shape,
                   const TensorOptions& options = {});
// A zero-dimensional tensor holding `value` (converted to options' dtype, float32 by default).
Tensor scalar_tensor(double value, const TensorOptions& options = {});

// libtorch's from_blob: a tensor over memory the caller owns, without copying it. `data`
// holds the elements in options' dtype (default float32) on options' device (host memory
// for a CPU device, memory of that GPU for a CUDA one), laid out contiguously or with the
// given strides (in elements, none negative). Writes through the tensor change the caller's
// memory and the other way round. `deleter(data)` runs exactly once, when the last tensor
// viewing the memory (views, autograd's saved tensors, ... included) is gone; without a
// deleter the memory is never freed by Tandem and must outlive every such tensor. If
// from_blob throws, the deleter is not called and the memory stays the caller's.
// options.requires_grad makes it a leaf that collects gradients; pinned is refused.
//   float* buffer = new float[6]{1, 2, 3, 4, 5, 6};
//   Tensor t = from_blob(buffer, {2, 3}, [](void* p) { delete[] static_cast<float*>(p); });
//   float values[4] = {1, 2, 3, 4};
//   Tensor v = from_blob(values, {4});   // must not outlive `values`
Tensor from_blob(void* data, const Shape& shape, std::function<void(void*)> deleter,
                 const TensorOptions& options = {});
Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options = {});
Tensor from_blob(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                 std::function<void(void*)> deleter, const TensorOptions& options = {});
Tensor from_blob(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                 const TensorOptions& options = {});

// PyTorch's Tensor.record_stream: tells the allocator that `tensor`'s memory is used by work
// queued on `stream`, which is not the stream the memory was allocated on (a communication
// stream reading a gradient, the destination's stream reading a copy's source). When the
// memory is freed, it is not handed out again until the work queued on `stream` at that time
// has finished. A no-op for CPU tensors and CPU streams (CPU work is synchronous) and for the
// allocating stream itself. Throws if the tensor is undefined, the stream's device does not
// exist, or the tensor's memory does not come from its device's allocator.
void RecordStream(const Tensor& tensor, Stream stream);

// Whether `t` is the only handle on all of its memory: a dense tensor that fills its storage
// from the start, that no other tensor (no view, no alias on another CPU device) shares, and
// that records no autograd history. Its memory may then be reused (stolen, written in place)
// by whoever holds the handle.
bool IsSoleOwner(const Tensor& t);

// A possibly negative dimension index normalised against `ndim` (-1 is the last), as
// PyTorch's maybe_wrap_dim, or an error naming `op` and the valid range.
//
//   int64_t axis = WrapDim(-1, x.dim(), "scatter");   // x.dim() - 1
int64_t WrapDim(int64_t dim, int64_t ndim, const char* op);

// The same memory as `tensor` (no copy), owned by the logical CPU device `device`: how data
// moves between logical CPU devices, which share host memory (comm's broadcast and scatter
// between cpu:i and cpu:j). Records no autograd history. Both devices must be CPU devices
// (the same one too). Copy-on-write: the alias stands for a copy, so its first in-place write
// gives it memory of its own and `tensor` never sees the write (the source's own writes, by
// contrast, are seen by an alias not yet written).
//
//   Tensor on_cpu1 = alias_on_cpu_device(x, Device::Cpu(1));   // same bytes as x
//   on_cpu1.add_(1.0);                                          // copies first: x unchanged
Tensor alias_on_cpu_device(const Tensor& tensor, Device device);
// Makes the in-place writes made through `alias` (an alias_on_cpu_device of `original`) reach
// `original`, as if made on it: `original` takes the alias's copy (no data is copied; other
// aliases keep the memory they saw). Nothing happens if the alias was never written.
// DataParallel's replica on device_ids[0] is such an alias between CPU devices, committed after
// the replicas ran, so that the other replicas read the parameters unchanged meanwhile.
void commit_alias_writes(const Tensor& original, const Tensor& alias);

// ---- Random numbers ------------------------------------------------------------------
// Counter-based (Philox) random numbers: a generator is a seed and an offset (the next
// counter); each request takes the next `n` counters, so the same seed and the same sequence
// of requests give the same numbers on every device and whatever the number of threads.
//
// Every device has a default generator of its own, as PyTorch has one per GPU: random
// factories and dropout without an explicit generator draw from the generator of the device
// they produce on (rand({3}, Device::Cpu(1)) from default_generator(cpu:1)). manual_seed(seed)
// seeds them all from the one seed, and the stream of device index i starts at counter
// DeviceOffsetBase(i) = i << 40. So:
//   - each device's numbers depend only on the requests made on that device, not on how the
//     threads of several devices interleave: DataParallel's replicas, each on its own device,
//     draw the same numbers in every run;
//   - replicas on different devices draw different numbers (different dropout masks);
//   - cpu:i and cuda:i draw the same numbers for the same requests.
//
//   tandem::manual_seed(42);
//   Tensor a = tandem::rand({3}, Device::Cpu(1));   // the same after every manual_seed(42)
//   tandem::GeneratorState saved = tandem::default_generator(Device::Cpu(1)).state();
//   Tensor b = tandem::rand({3}, Device::Cpu(1));
//   tandem::default_generator(Device::Cpu(1)).set_state(saved);   // e.g. from a checkpoint
//   Tensor c = tandem::rand({3}, Device::Cpu(1));   // equal to b

// Everything that determines a generator's future numbers (what a checkpoint saves).
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // the first counter of the next request

  friend bool operator==(const GeneratorState& a, const GeneratorState& b) {
    return a.seed == b.seed && a.offset == b.offset;
  }
  friend bool operator!=(const GeneratorState& a, const GeneratorState& b) { return !(a == b); }
};

// A seeded stream of Philox counters. Thread-safe.
class Generator {
 public:
  // A stream whose first request starts at counter `base_offset` (0 for a generator of your
  // own; DeviceOffsetBase(i) for the generators of device index i).
  explicit Generator(uint64_t seed = 0, uint64_t base_offset = 0)
      : seed_(seed), base_offset_(base_offset), offset_(base_offset) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Restarts the stream: the next request gets the same numbers as the first one did.
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t base_offset() const { return base_offset_; }
  // The seed and the next counter, read together; set_state(state()) changes nothing, and
  // restoring a saved state makes the generator repeat what followed it.
  GeneratorState state() const;
  void set_state(const GeneratorState& state);
  // Reserves `n` counters (rounded up to whole Philox blocks of 4) and returns the first.
  uint64_t Reserve(uint64_t n);
  // Reserve(n) and the seed that goes with it, taken under one lock (so that a concurrent
  // manual_seed cannot pair the new seed with the old offset).
  GeneratorState Claim(uint64_t n);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  const uint64_t base_offset_;
  uint64_t offset_;
};

// Notes, while it lives, each generator the calling thread draws from (Claim, Reserve: random
// factories, dropout) and that generator's state before the first draw. Activation
// checkpointing (nn/activation_checkpoint.h) restores those states to make a recomputed
// forward draw the numbers the first one drew, whichever generators it used (the devices'
// default ones, a Dropout's own). Recorders nest: a draw is noted by every open one on the
// thread. The pointers are the generators' own: they must outlive the use made of them.
//
//   GeneratorRecorder recorder;
//   Tensor y = dropout(x, 0.1, true);
//   for (const auto& [gen, state] : recorder.uses()) gen->set_state(state);  // replay
class GeneratorRecorder {
 public:
  GeneratorRecorder();
  ~GeneratorRecorder();
  GeneratorRecorder(const GeneratorRecorder&) = delete;
  GeneratorRecorder& operator=(const GeneratorRecorder&) = delete;

  // In order of first use.
  const std::vector<std::pair<Generator*, GeneratorState>>& uses() const { return uses_; }
  // Called by Generator::Claim on the drawing thread.
  static void Note(Generator* generator, const GeneratorState& before);

 private:
  GeneratorRecorder* previous_;
  std::vector<std::pair<Generator*, GeneratorState>> uses_;
};

// Device index i's streams start at counter i << kDeviceOffsetShift: 2^40 (about 10^12)
// numbers per device before its stream would run into the next device's.
inline constexpr int kDeviceOffsetShift = 40;
uint64_t DeviceOffsetBase(int device_index);

// One generator per device, made on first use, all seeded from one seed: device d's stream
// starts at DeviceOffsetBase(d.index()). Thread-safe; looking up a device seen before takes
// no lock. The process-wide default generators are one such set; nn::Dropout with a seed of
// its own holds another.
class DeviceGenerators {
 public:
  explicit DeviceGenerators(uint64_t seed = 0);
  ~DeviceGenerators();
  DeviceGenerators(const DeviceGenerators&) = delete;
  DeviceGenerators& operator=(const DeviceGenerators&) = delete;

  // The generator of `device` (whose index must be in [0, 2^(64 - kDeviceOffsetShift))).
  Generator& get(Device device);
  // Reseeds every device's generator, those made later included, and restarts their streams.
  void manual_seed(uint64_t seed);
  uint64_t seed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The default generator of `device`, used by random factories and dropout on that device
// when no generator is passed. Without an argument: cpu:0's.
Generator& default_generator(Device device);
Generator& default_generator();
// Seeds the default generator of every device (PyTorch's torch.manual_seed).
void manual_seed(uint64_t seed);

// Uniform in [0, 1) and standard normal, from `gen` or, when it is null, from the default
// generator of the device in `options`.
Tensor rand(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& options = {},
               Generator* gen = nullptr);
// A random permutation of 0..n-1 (int64, on the CPU), from `gen` (default: cpu:0's).
Tensor randperm(int64_t n, Generator* gen = nullptr);

}  // namespace tandem

#endif  // TANDEM_TENSOR_CORE_TENSOR_H_
