// The Tensor handle: shapes and strides, the construction helpers of tensor_impl.h, metadata,
// element access, copies between devices and dtypes, in-place writes, autograd accessors and
// RecordStream. Views, factories and printing are in tensor_views.cc, tensor_factories.cc and
// tensor_printing.cc.
#include "tensor/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/mem_overlap.h"
#include "tensor/runtime/allocator.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {

// ---- Shapes ------------------------------------------------------------------------------

std::string ShapeToString(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

int64_t NumElements(const Shape& shape) {
  // A size of 0 anywhere makes an empty tensor, however large the other sizes are; otherwise
  // the product must fit (a corrupt file or a bad computation can ask for any sizes).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t s : shape) {
    TANDEM_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", ShapeToString(shape),
                 " has more elements than an int64 counts (2^63 - 1); expected a smaller shape");
  }
  return n;
}

std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    if (d == 0) break;  // the outermost size needs no stride beyond it
    TANDEM_CHECK(!__builtin_mul_overflow(stride, std::max<int64_t>(shape[d], 1), &stride), "shape ",
                 ShapeToString(shape), " is too large for int64 strides; expected a smaller shape");
  }
  return strides;
}

int64_t WrapDim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim;
  const int64_t hi = ndim == 0 ? 0 : ndim - 1;
  TANDEM_CHECK(dim >= lo && dim <= hi, op, ": dimension ", dim,
               " is out of range for a tensor with ", ndim,
               " dimension(s); expected a dimension in [", lo, ", ", hi, "]");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op) {
  const size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    const int64_t da = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    const int64_t db = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    TANDEM_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", ShapeToString(a), " and ",
                 ShapeToString(b), " cannot be broadcast together (dimension ", i, ": ", da, " vs ",
                 db, "); sizes must match or be 1");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---- Construction helpers -----------------------------------------------------------------

Tensor NewTensor(const Shape& shape, DType dtype, Device device, bool pinned) {
  for (int64_t s : shape) {
    TANDEM_CHECK(s >= 0, "cannot create a tensor of shape ", ShapeToString(shape),
                 ": sizes must be >= 0");
  }
  TANDEM_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "tensors have at most ", kMaxDims,
               " dimensions but shape ", ShapeToString(shape), " has ", shape.size());
  CheckAvailable(device);
  auto storage = std::make_shared<Storage>();
  storage->bytes = static_cast<size_t>(NumElements(shape)) * ElementSize(dtype);
  storage->device = device;
  if (pinned) {
    TANDEM_CHECK(device.is_cpu(), "pinned memory is host memory: the device must be a cpu device, ",
                 "not ", device);
    Backend* cuda = FindBackend(DeviceType::kCUDA);
    TANDEM_CHECK(cuda != nullptr && cuda->DeviceCount() > 0,
                 "pinned memory needs a CUDA build with a GPU: ",
                 cuda == nullptr ? std::string("this build has no CUDA backend")
                                 : cuda->UnavailableReason());
    storage->data = cuda->AllocatePinnedHost(storage->bytes);
    storage->pinned = true;
  } else {
    storage->data = GetBackend(device).GetAllocator(device.index()).Allocate(storage->bytes);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = ContiguousStrides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor MakeView(const Tensor& base, const Shape& shape, const std::vector<int64_t>& strides,
                int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

bool IsSoleOwner(const Tensor& t) {
  const TensorImpl* impl = t.impl();
  const Storage& storage = *impl->storage;
  return !impl->requires_grad && impl->grad_fn == nullptr && impl->offset == 0 &&
         t.is_contiguous() &&
         storage.bytes == static_cast<size_t>(t.numel()) * ElementSize(t.dtype()) &&
         t.impl_ptr().use_count() == 1 && impl->storage.use_count() == 1 &&
         storage.data.use_count() == 1;
}

KernelTensor ToKernel(const Tensor& tensor) {
  TANDEM_CHECK(tensor.defined(), "an undefined tensor was passed to a kernel");
  KernelTensor k;
  k.data = tensor.raw_data();
  k.dtype = tensor.dtype();
  k.ndim = static_cast<int>(tensor.dim());
  TANDEM_CHECK(k.ndim <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
  for (int d = 0; d < k.ndim; ++d) {
    k.sizes[d] = tensor.shape()[d];
    k.strides[d] = tensor.strides()[d];
  }
  return k;
}

KernelTensor ToKernelBroadcast(const Tensor& tensor, const Shape& shape) {
  KernelTensor k = ToKernel(tensor);
  const int ndim = static_cast<int>(shape.size());
  const int lead = ndim - k.ndim;
  TANDEM_CHECK(lead >= 0 && ndim <= kMaxDims, "cannot broadcast ", ShapeToString(tensor.shape()),
               " to ", ShapeToString(shape));
  KernelTensor out;
  out.data = k.data;
  out.dtype = k.dtype;
  out.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    out.sizes[d] = shape[d];
    if (d < lead) {
      out.strides[d] = 0;
    } else {
      const int64_t size = k.sizes[d - lead];
      TANDEM_CHECK(size == shape[d] || size == 1, "cannot broadcast ",
                   ShapeToString(tensor.shape()), " to ", ShapeToString(shape));
      out.strides[d] = size == shape[d] ? k.strides[d - lead] : 0;
    }
  }
  return out;
}

namespace {

// Copies src into dst (same shape and dtype, dst contiguous) across any two devices.
void CopyContiguousAcrossDevices(const Tensor& dst, const Tensor& src) {
  const Device to = dst.device();
  const Device from = src.device();
  const size_t bytes = static_cast<size_t>(src.numel()) * ElementSize(src.dtype());
  if (bytes == 0) return;
  if (to.type() == from.type()) {
    if (to == from || to.is_cpu()) {
      GetBackend(to).Copy(to.index(), ToKernel(dst), ToKernel(src));
    } else {
      GetBackend(to).CopyBetweenDevices(to.index(), dst.raw_data(), from.index(), src.raw_data(),
                                        bytes);
    }
  } else if (from.is_cpu()) {
    GetBackend(to).CopyFromHost(to.index(), dst.raw_data(), src.raw_data(), bytes);
  } else if (to.is_cpu()) {
    GetBackend(from).CopyToHost(from.index(), dst.raw_data(), src.raw_data(), bytes);
  } else {
    // Two different accelerator types: stage through the host.
    Tensor staging = NewTensor(src.shape(), src.dtype(), Device::Cpu(0));
    CopyContiguousAcrossDevices(staging, src);
    CopyContiguousAcrossDevices(dst, staging);
  }
}

// Note [Copy-on-write aliases]: logical CPU devices share host memory, so data moves between
// them as aliases (alias_on_cpu_device) instead of copies. An alias behaves as the copy it
// stands for: its first in-place write (through it or any view of it: they share its
// Storage) gives it memory of its own, so the source never sees the write (PyTorch's
// replicas on devices other than device_ids[0] hold copies). The copy is taken on the writing
// thread; CPU work is synchronous, so no queued kernel is still writing the source.
void MaterializeCopyOnWrite(const Tensor& t) {
  Storage& storage = *t.impl()->storage;
  if (!storage.copy_on_write) return;
  std::shared_ptr<void> own =
      GetBackend(storage.device).GetAllocator(storage.device.index()).Allocate(storage.bytes);
  if (storage.bytes > 0) std::memcpy(own.get(), storage.data.get(), storage.bytes);
  storage.data = std::move(own);
  storage.copy_on_write = false;
}

// Every in-place write of a Tensor method comes through here.
void CheckInPlaceAllowed(const Tensor& t, const char* op) {
  TANDEM_CHECK(!(t.requires_grad() && GradMode::IsEnabled()), op,
               ": a tensor that requires grad cannot be modified in place while autograd is "
               "recording (it would corrupt the graph); do it under tandem::NoGradGuard or on "
               "a detach()ed tensor");
  MaterializeCopyOnWrite(t);
}

}  // namespace

// ---- Metadata --------------------------------------------------------------------------

void Tensor::CheckDefined(const char* what) const {
  TANDEM_CHECK(impl_ != nullptr, what,
               " called on an undefined tensor (default-constructed, or a gradient that was "
               "never computed)");
}

const Shape& Tensor::shape() const {
  CheckDefined("shape()");
  return impl_->shape;
}
const std::vector<int64_t>& Tensor::strides() const {
  CheckDefined("strides()");
  return impl_->strides;
}
int64_t Tensor::size(int64_t d) const { return shape()[WrapDim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return NumElements(shape()); }
DType Tensor::dtype() const {
  CheckDefined("dtype()");
  return impl_->dtype;
}
Device Tensor::device() const {
  CheckDefined("device()");
  return impl_->device();
}
int64_t Tensor::storage_offset() const {
  CheckDefined("storage_offset()");
  return impl_->offset;
}
bool Tensor::is_contiguous() const {
  const Shape& s = shape();
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (s[d] != 1 && impl_->strides[d] != expected) return false;
    expected *= s[d];
  }
  return true;
}
bool Tensor::is_pinned() const {
  CheckDefined("is_pinned()");
  return impl_->storage->pinned;
}
bool Tensor::shares_storage_with(const Tensor& other) const {
  if (!defined() || !other.defined()) return false;
  const Storage& mine = *impl_->storage;
  const Storage& theirs = *other.impl_->storage;
  // Two Storage objects may own the same memory: logical CPU devices share host memory, and
  // parallel::broadcast/scatter hand a device a view of another's without copying.
  return &mine == &theirs || (mine.bytes > 0 && mine.data.get() == theirs.data.get());
}

void* Tensor::raw_data() const {
  CheckDefined("data()");
  // Note [Released storage]: ReleaseStorage (tensor/core/storage_residency.h) frees a storage's
  // memory in place and keeps its size; every kernel reaches memory through here.
  TANDEM_CHECK(impl_->storage->data != nullptr || impl_->storage->bytes == 0, "this ",
               ShapeToString(shape()), " ", dtype(),
               " tensor's memory was released (ReleaseStorage): it is a parameter of a fully "
               "sharded unit outside that unit's forward and backward, or a view of one. Read "
               "parameters through FullyShardedDataParallel (full_state_dict, or the unit's own "
               "forward), not from the wrapped module");
  return impl_->data();
}

namespace {
template <typename T>
const char* CppTypeName();
#define TANDEM_CPP_TYPE_NAME(type, name, text) \
  template <>                                  \
  const char* CppTypeName<type>() {            \
    return #type;                              \
  }
TANDEM_FORALL_DTYPES(TANDEM_CPP_TYPE_NAME)
#undef TANDEM_CPP_TYPE_NAME
const char* CppTypeName(DType dtype) {
  return DispatchDType(dtype, "CppTypeName",
                       [](auto tag) { return CppTypeName<typename decltype(tag)::type>(); });
}
}  // namespace

template <typename T>
T* Tensor::data() const {
  CheckDefined("data()");
  TANDEM_CHECK(dtype() == DTypeOf<T>::value, "data<", CppTypeName<T>(), ">() expects a ",
               DTypeOf<T>::value, " tensor but this one is ", dtype(), "; ask for data<",
               CppTypeName(dtype()), ">() or convert it first with .to(", DTypeOf<T>::value, ")");
  return static_cast<T*>(raw_data());
}
#define TANDEM_INSTANTIATE_DATA(type, name, text) template type* Tensor::data<type>() const;
TANDEM_FORALL_DTYPES(TANDEM_INSTANTIATE_DATA)
#undef TANDEM_INSTANTIATE_DATA

template <typename T>
T* Tensor::data_ptr() const {
  CheckDefined("data_ptr()");
  TANDEM_CHECK(dtype() == DTypeOf<T>::value, "data_ptr<", CppTypeName<T>(), ">() expects a ",
               DTypeOf<T>::value, " tensor but this one is ", dtype(), "; ask for data_ptr<",
               CppTypeName(dtype()), ">() or convert it first with .to(", DTypeOf<T>::value, ")");
  return static_cast<T*>(raw_data());
}
#define TANDEM_INSTANTIATE_DATA_PTR(type, name, text) template type* Tensor::data_ptr<type>() const;
TANDEM_FORALL_DTYPES(TANDEM_INSTANTIATE_DATA_PTR)
#undef TANDEM_INSTANTIATE_DATA_PTR

template <typename T>
std::vector<T> Tensor::to_vector() const {
  TANDEM_CHECK(dtype() == DTypeOf<T>::value, "to_vector<", DTypeName(DTypeOf<T>::value),
               ">() called on a ", dtype(), " tensor; use to(", DTypeName(DTypeOf<T>::value),
               ") first or ask for the matching type");
  Tensor host = detach().to(Device::Cpu(0)).contiguous();
  const T* begin = host.data<T>();
  return std::vector<T>(begin, begin + host.numel());
}
#define TANDEM_INSTANTIATE_TO_VECTOR(type, name, text) \
  template std::vector<type> Tensor::to_vector<type>() const;
TANDEM_FORALL_DTYPES(TANDEM_INSTANTIATE_TO_VECTOR)
#undef TANDEM_INSTANTIATE_TO_VECTOR

double Tensor::item() const { return item<double>(); }

// ---- Copies ----------------------------------------------------------------------------

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor src = detach().contiguous();
  Tensor out = NewTensor(shape(), dtype(), target);
  CopyContiguousAcrossDevices(out, src);
  const Device source = device();
  if (NeedsGrad({*this})) {
    // The node runs where the incoming gradient lives: on the target device.
    auto node = std::make_shared<FunctionNode>(
        "ToDeviceBackward", target,
        [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; },
        DoubleBackward::kSupported);
    RecordOp(node, {*this}, out);
  }
  return out;
}

Tensor Tensor::to(DType type) const {
  if (type == dtype()) return *this;
  Tensor out = NewTensor(shape(), type, device());
  GetBackend(device()).Copy(device().index(), ToKernel(out), ToKernel(*this));
  const DType source = dtype();
  // Between floating types the gradient flows back converted (PyTorch's to(dtype) too).
  if (IsFloatingPoint(type) && IsFloatingPoint(source) && NeedsGrad({*this})) {
    RecordOp(
        "ToDTypeBackward", {*this}, out,
        [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; },
        DoubleBackward::kSupported);
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  TANDEM_CHECK(device().is_cpu(), "pin_memory: only cpu tensors can be pinned, not one on ",
               device());
  if (is_pinned()) return *this;
  Tensor out = NewTensor(shape(), dtype(), device(), /*pinned=*/true);
  GetBackend(device()).Copy(device().index(), ToKernel(out), ToKernel(*this));
  return out;
}

Tensor Tensor::detach() const {
  CheckDefined("detach()");
  return MakeView(*this, shape(), strides(), storage_offset());
}

// ---- In-place --------------------------------------------------------------------------

Tensor& Tensor::fill_(double value) {
  CheckInPlaceAllowed(*this, "fill_");
  if (numel() > 0) GetBackend(device()).Fill(device().index(), ToKernel(*this), value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  CheckInPlaceAllowed(*this, "copy_");
  TANDEM_CHECK(src.defined(), "copy_: the source tensor is undefined");
  BroadcastShapes(shape(), src.shape(), "copy_");  // validates with a clear message
  if (numel() == 0) return *this;
  CheckNoInternalOverlap(*this, "copy_");
  const MemOverlap overlap = CheckNoPartialOverlap(*this, src, "copy_");
  if (overlap == MemOverlap::kFull && src.dtype() == dtype()) return *this;  // x.copy_(x)
  Tensor source = src.detach();
  if (source.device() != device() && source.shape() == shape() && source.dtype() == dtype() &&
      source.is_contiguous() && is_contiguous()) {
    CopyContiguousAcrossDevices(*this, source);  // one copy, no staging tensor
    return *this;
  }
  if (source.device() != device()) source = source.to(device());
  GetBackend(device()).Copy(device().index(), ToKernel(*this), ToKernelBroadcast(source, shape()));
  return *this;
}

namespace {

Tensor& BinaryInPlace(Tensor& self, BinaryOp op, const Tensor& other, const char* name) {
  CheckInPlaceAllowed(self, name);
  TANDEM_CHECK(other.defined(), name, ": the other tensor is undefined");
  TANDEM_CHECK(other.device() == self.device(), name, ": this tensor is on ", self.device(),
               " but the other is on ", other.device(), "; move it with .to(", self.device(), ")");
  const Shape result = BroadcastShapes(self.shape(), other.shape(), name);
  TANDEM_CHECK(result == self.shape(), name, ": the result shape ", ShapeToString(result),
               " would not fit in this tensor of shape ", ShapeToString(self.shape()));
  CheckNoInternalOverlap(self, name);
  CheckNoPartialOverlap(self, other, name);
  Tensor rhs = other.detach();
  if (rhs.dtype() != self.dtype()) rhs = rhs.to(self.dtype());
  if (self.numel() == 0) return self;
  GetBackend(self.device())
      .Binary(self.device().index(), op, ToKernel(self), ToKernel(self),
              ToKernelBroadcast(rhs, self.shape()));
  return self;
}

Tensor& UnaryInPlace(Tensor& self, UnaryOp op, double scalar, const char* name) {
  CheckInPlaceAllowed(self, name);
  CheckNoInternalOverlap(self, name);
  if (self.numel() == 0) return self;
  GetBackend(self.device())
      .Unary(self.device().index(), op, ToKernel(self), ToKernel(self), scalar);
  return self;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (alpha == 1.0) return BinaryInPlace(*this, BinaryOp::kAdd, other, "add_");
  TANDEM_CHECK(other.defined(), "add_: the other tensor is undefined");
  // Refused as PyTorch's one kernel refuses it, though the scaled copy below would not race.
  CheckNoPartialOverlap(*this, other, "add_");
  // alpha * other first, in floating point unless both are integral (as mul would compute it).
  const bool integral = !IsFloatingPoint(other.dtype()) && alpha == std::floor(alpha);
  const Tensor source =
      integral || IsFloatingPoint(other.dtype()) ? other.detach() : other.detach().to(kFloat32);
  Tensor scaled = NewTensor(source.shape(), source.dtype(), source.device());
  if (scaled.numel() > 0) {
    GetBackend(source.device())
        .Unary(source.device().index(), UnaryOp::kMulScalar, ToKernel(scaled), ToKernel(source),
               alpha);
  }
  return BinaryInPlace(*this, BinaryOp::kAdd, scaled, "add_");
}
Tensor& Tensor::mul_(const Tensor& other) {
  return BinaryInPlace(*this, BinaryOp::kMul, other, "mul_");
}
Tensor& Tensor::div_(const Tensor& other) {
  return BinaryInPlace(*this, BinaryOp::kDiv, other, "div_");
}
Tensor& Tensor::mul_(double scalar) {
  return UnaryInPlace(*this, UnaryOp::kMulScalar, scalar, "mul_");
}
Tensor& Tensor::add_(double scalar) {
  return UnaryInPlace(*this, UnaryOp::kAddScalar, scalar, "add_");
}

// ---- Autograd accessors ----------------------------------------------------------------

bool Tensor::requires_grad() const { return defined() && impl_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  CheckDefined("set_requires_grad()");
  TANDEM_CHECK(is_leaf(), "set_requires_grad: only leaf tensors (not results of recorded ops) can ",
               "be marked; use detach() to make a new leaf");
  TANDEM_CHECK(!requires_grad || IsFloatingPoint(dtype()),
               "set_requires_grad: only floating-point tensors (float32, float64, bfloat16, ",
               "float16) can require gradients, not ", dtype(), "; convert it with .to(kFloat32)");
  impl_->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return defined() && impl_->grad_fn == nullptr; }

Tensor Tensor::grad() const {
  CheckDefined("grad()");
  std::lock_guard<std::mutex> lock(impl_->grad_mutex);
  return impl_->grad;
}

void Tensor::set_grad(const Tensor& grad) {
  CheckDefined("set_grad()");
  if (grad.defined()) {
    TANDEM_CHECK(grad.shape() == shape() && grad.device() == device(),
                 "set_grad: the gradient must have this tensor's shape ", ShapeToString(shape()),
                 " and device ", device(), " but has ", ShapeToString(grad.shape()), " on ",
                 grad.device());
  }
  std::lock_guard<std::mutex> lock(impl_->grad_mutex);
  impl_->grad = grad;
}

void Tensor::backward(const Tensor& gradient, bool create_graph,
                      std::optional<bool> retain_graph) const {
  CheckDefined("backward()");
  TANDEM_CHECK(requires_grad(), "backward: this tensor does not require grad and has no grad_fn; ",
               "mark an input with set_requires_grad(true) before computing it");
  Tensor grad = gradient;
  if (!grad.defined()) {
    TANDEM_CHECK(numel() == 1, "backward: a gradient must be given for a tensor of shape ",
                 ShapeToString(shape()), " (only one-element tensors get an implicit 1)");
    grad = ones(shape(), TensorOptions().device(device()).dtype(dtype()));
  }
  TANDEM_CHECK(grad.shape() == shape(), "backward: the gradient has shape ",
               ShapeToString(grad.shape()), " but the tensor has shape ", ShapeToString(shape()));
  RunBackward({*this}, {create_graph ? grad : grad.detach()}, create_graph, retain_graph);
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  CheckDefined("grad_fn()");
  return impl_->grad_fn;
}

// ---- RecordStream ------------------------------------------------------------------------

void RecordStream(const Tensor& tensor, Stream stream) {
  TANDEM_CHECK(tensor.defined(),
               "RecordStream: the tensor is undefined; pass a tensor that "
               "holds memory");
  const Device device = tensor.device();
  CheckAvailable(stream.device());
  // CPU work is synchronous: nothing is ever queued behind the host's back.
  if (device.is_cpu() || stream.device().is_cpu() || tensor.numel() == 0) return;
  GetAllocator(device).RecordStream(tensor.raw_data(), stream);
}

}  // namespace tandem
