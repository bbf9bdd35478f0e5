#include "tensor/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>

#include "tensor/base/philox.h"
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

std::string FormatElements(const Tensor& host);

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

// ---- Views -----------------------------------------------------------------------------

namespace {

Shape InferShape(Shape shape, int64_t numel, const Shape& from) {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TANDEM_CHECK(infer < 0, "view/reshape: only one dimension can be -1 in ",
                   ShapeToString(shape));
      infer = static_cast<int>(i);
    } else {
      TANDEM_CHECK(shape[i] >= 0, "view/reshape: invalid size ", shape[i], " in ",
                   ShapeToString(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    TANDEM_CHECK(known != 0 && numel % known == 0, "view/reshape: cannot infer -1 in ",
                 ShapeToString(shape), " for a tensor of shape ", ShapeToString(from), " (", numel,
                 " elements)");
    shape[infer] = numel / known;
    known *= shape[infer];
  }
  TANDEM_CHECK(known == numel, "view/reshape: shape ", ShapeToString(shape), " has ", known,
               " elements but the tensor of shape ", ShapeToString(from), " has ", numel);
  return shape;
}

// Records a backward for a view-like op whose gradient is `backward(grad)`.
Tensor RecordView(const Tensor& input, Tensor out, const char* name,
                  FunctionNode::Backward backward) {
  if (NeedsGrad({input})) RecordOp(name, {input}, out, std::move(backward));
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  const Shape target = InferShape(new_shape, numel(), shape());
  TANDEM_CHECK(is_contiguous(), "view: the tensor of shape ", ShapeToString(shape()),
               " is not contiguous (strides ", ShapeToString(strides()),
               "), so it cannot be viewed as ", ShapeToString(target),
               "; use reshape() or contiguous() first");
  Tensor out = MakeView(*this, target, ContiguousStrides(target), storage_offset());
  const Shape original = shape();
  return RecordView(*this, out, "ViewBackward", [original](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(original)};
  });
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  return is_contiguous() ? view(new_shape) : contiguous().view(new_shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t start = WrapDim(start_dim, dim(), "flatten");
  const int64_t end = WrapDim(end_dim, dim(), "flatten");
  TANDEM_CHECK(start <= end, "flatten: start_dim (", start_dim, ") must not come after end_dim (",
               end_dim, ")");
  Shape target(shape().begin(), shape().begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= shape()[d];
  target.push_back(merged);
  target.insert(target.end(), shape().begin() + end + 1, shape().end());
  return reshape(target);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  TANDEM_CHECK(dim() > 0, "narrow: cannot narrow a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "narrow");
  const int64_t n = shape()[axis];
  TANDEM_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start ", start,
               " and length ", length, " are out of range for dimension ", axis, " of size ", n,
               " (shape ", ShapeToString(shape()), "); need 0 <= start and start + length <= ", n);
  Shape target = shape();
  target[axis] = length;
  Tensor out = MakeView(*this, target, strides(), storage_offset() + start * strides()[axis]);
  const Shape original = shape();
  const Device device = this->device();
  const DType type = dtype();
  return RecordView(*this, out, "NarrowBackward",
                    [original, device, type, axis, start, length](const Tensor& g) {
                      Tensor grad = zeros(original, TensorOptions().device(device).dtype(type));
                      grad.narrow(axis, start, length).copy_(g);
                      return std::vector<Tensor>{grad};
                    });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const int64_t axis = WrapDim(d, dim(), "select");
  const int64_t n = shape()[axis];
  TANDEM_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ",
               axis, " of size ", n);
  return narrow(axis, index < 0 ? index + n : index, 1).squeeze(axis);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  TANDEM_CHECK(chunks > 0, "chunk: the number of chunks must be positive but is ", chunks);
  TANDEM_CHECK(dim() > 0, "chunk: cannot chunk a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "chunk");
  const int64_t n = shape()[axis];
  // torch.chunk: pieces of ceil(n / chunks), so fewer than `chunks` pieces may come back.
  const int64_t piece = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  if (n == 0) return {*this};
  return split(piece, axis);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  TANDEM_CHECK(split_size > 0, "split: split_size must be positive but is ", split_size);
  TANDEM_CHECK(dim() > 0, "split: cannot split a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "split");
  const int64_t n = shape()[axis];
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size) {
    sizes.push_back(std::min(split_size, n - start));
  }
  if (sizes.empty()) sizes.push_back(0);
  return split_with_sizes(sizes, axis);
}

std::vector<Tensor> Tensor::split_with_sizes(const std::vector<int64_t>& sizes, int64_t d) const {
  TANDEM_CHECK(dim() > 0, "split_with_sizes: cannot split a 0-dimensional tensor");
  const int64_t axis = WrapDim(d, dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TANDEM_CHECK(s >= 0, "split_with_sizes: sizes must be >= 0 but got ", ShapeToString(sizes));
    total += s;
  }
  TANDEM_CHECK(total == shape()[axis], "split_with_sizes: sizes ", ShapeToString(sizes),
               " add up to ", total, " but dimension ", axis, " has size ", shape()[axis]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow(axis, start, s));
    start += s;
  }
  return pieces;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  if (dim() == 0) return *this;
  const int64_t a = WrapDim(dim0, dim(), "transpose");
  const int64_t b = WrapDim(dim1, dim(), "transpose");
  Shape s = shape();
  std::vector<int64_t> st = strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  Tensor out = MakeView(*this, s, st, storage_offset());
  return RecordView(*this, out, "TransposeBackward",
                    [a, b](const Tensor& g) { return std::vector<Tensor>{g.transpose(a, b)}; });
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  TANDEM_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: got ", dims.size(),
               " dimensions ", ShapeToString(dims), " for a tensor with ", dim());
  std::vector<int64_t> order(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  Shape s(dims.size());
  std::vector<int64_t> st(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = WrapDim(dims[i], dim(), "permute");
    TANDEM_CHECK(!seen[d], "permute: dimension ", d, " appears twice in ", ShapeToString(dims));
    seen[d] = true;
    order[i] = d;
    inverse[d] = static_cast<int64_t>(i);
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  Tensor out = MakeView(*this, s, st, storage_offset());
  return RecordView(*this, out, "PermuteBackward",
                    [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int64_t axis = WrapDim(d, dim() + 1, "unsqueeze");
  Shape s = shape();
  std::vector<int64_t> st = strides();
  const int64_t stride = axis < dim() ? st[axis] * s[axis] : 1;
  s.insert(s.begin() + axis, 1);
  st.insert(st.begin() + axis, stride);
  Tensor out = MakeView(*this, s, st, storage_offset());
  const Shape original = shape();
  return RecordView(*this, out, "UnsqueezeBackward", [original](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(original)};
  });
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  const int64_t axis = WrapDim(d, dim(), "squeeze");
  if (shape()[axis] != 1) return *this;
  Shape s = shape();
  std::vector<int64_t> st = strides();
  s.erase(s.begin() + axis);
  st.erase(st.begin() + axis);
  Tensor out = MakeView(*this, s, st, storage_offset());
  const Shape original = shape();
  return RecordView(*this, out, "SqueezeBackward", [original](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(original)};
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = NewTensor(shape(), dtype(), device());
  GetBackend(device()).Copy(device().index(), ToKernel(out), ToKernel(*this));
  return RecordView(*this, out, "ContiguousBackward",
                    [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

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
        [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
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
    RecordOp("ToDTypeBackward", {*this}, out,
             [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
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

Tensor Tensor::clone() const {
  Tensor out = NewTensor(shape(), dtype(), device());
  GetBackend(device()).Copy(device().index(), ToKernel(out), ToKernel(*this));
  return RecordView(*this, out, "CloneBackward",
                    [](const Tensor& g) { return std::vector<Tensor>{g}; });
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

void Tensor::backward(const Tensor& gradient) const {
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
  RunBackward({*this}, {grad.detach()});
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  CheckDefined("grad_fn()");
  return impl_->grad_fn;
}

// ---- Printing --------------------------------------------------------------------------

namespace {

constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

// One element as PyTorch prints it: floating types with 4 decimals (16-bit floats by their
// exact value, widened to float), bool as True/False, integers as they are (uint8 as a
// number, not a character).
void FormatElement(std::ostream& out, const Tensor& host, int64_t at) {
  DispatchDType(host.dtype(), "print", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T value = host.data<T>()[at];
    if constexpr (std::is_same_v<T, bool>) {
      out << (value ? "True" : "False");
    } else if constexpr (std::is_floating_point_v<T> || kIsReducedFloat<T>) {
      out << std::fixed << std::setprecision(4) << static_cast<OpMath<T>>(value);
    } else {
      out << static_cast<int64_t>(value);
    }
  });
}

void FormatRecursive(std::ostringstream& out, const Tensor& t, int64_t d, int64_t offset,
                     const std::vector<int64_t>& strides, int indent, int width, bool summarise) {
  const int64_t n = t.shape()[d];
  out << "[";
  const bool last = d == t.dim() - 1;
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      out << (last ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems - 1;
      continue;
    }
    const int64_t at = offset + i * strides[d];
    if (last) {
      out << std::setw(width);
      FormatElement(out, t, at);
    } else {
      FormatRecursive(out, t, d + 1, at, strides, indent + 1, width, summarise);
    }
    if (i + 1 < n) {
      // PyTorch separates rows by a newline and deeper blocks by one more blank line.
      const int blank_lines = static_cast<int>(t.dim() - d - 2);
      out << (last ? ", " : ",\n" + std::string(blank_lines, '\n') + std::string(indent + 1, ' '));
    }
  }
  out << "]";
}

std::string FormatElements(const Tensor& host) {
  std::ostringstream out;
  if (host.dim() == 0) {
    FormatElement(out, host, 0);
    return out.str();
  }
  if (host.numel() == 0) return "[]";
  int width = 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    std::ostringstream cell;
    FormatElement(cell, host, i);
    width = std::max<int>(width, static_cast<int>(cell.str().size()));
  }
  FormatRecursive(out, host, 0, 0, host.strides(), /*indent=*/7, width,
                  host.numel() > kSummaryThreshold);
  return out.str();
}

}  // namespace

std::string Tensor::ToString() const {
  if (!defined()) return "tensor(undefined)";
  Tensor host = detach().to(Device::Cpu(0)).contiguous();
  std::string text = "tensor(" + FormatElements(host);
  if (device() != Device::Cpu(0)) text += ", device='" + device().ToString() + "'";
  // PyTorch names the dtype unless the printed values imply it: float32 (the default),
  // int64 (integers) and bool (True/False).
  if (dtype() != kFloat32 && dtype() != kInt64 && dtype() != kBool) {
    text += std::string(", dtype=") + DTypeName(dtype());
  }
  if (grad_fn()) {
    text += ", grad_fn=<" + grad_fn()->name() + ">";
  } else if (requires_grad()) {
    text += ", requires_grad=True";
  }
  return text + ")";
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.ToString();
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

// ---- Factories -------------------------------------------------------------------------

namespace {

Tensor Finish(Tensor t, const TensorOptions& options) {
  if (options.requires_grad_) t.set_requires_grad(true);
  return t;
}

}  // namespace

Tensor empty(const Shape& shape, const TensorOptions& options) {
  return Finish(
      NewTensor(shape, options.dtype_.value_or(kFloat32), options.device_, options.pinned_),
      options);
}

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  Tensor t = NewTensor(shape, options.dtype_.value_or(kFloat32), options.device_, options.pinned_);
  if (t.numel() > 0) GetBackend(t.device()).Fill(t.device().index(), ToKernel(t), value);
  return Finish(t, options);
}

Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }
Tensor zeros_like(const Tensor& like) {
  return zeros(like.shape(), TensorOptions().dtype(like.dtype()).device(like.device()));
}
Tensor ones_like(const Tensor& like) {
  return ones(like.shape(), TensorOptions().dtype(like.dtype()).device(like.device()));
}
Tensor scalar_tensor(double value, const TensorOptions& options) {
  return full({}, value, options);
}

namespace {

template <typename T>
Tensor FromHost(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == NumElements(shape),
               "from_vector: ", values.size(), " values cannot fill shape ", ShapeToString(shape),
               " (", NumElements(shape), " elements)");
  Tensor host = NewTensor(shape, DTypeOf<T>::value, Device::Cpu(0));
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  Tensor out = host.to(options.dtype_.value_or(DTypeOf<T>::value)).to(options.device_);
  if (options.pinned_) out = out.pin_memory();
  return Finish(out, options);
}

}  // namespace

Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<BFloat16>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<Half>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<uint8_t>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<bool>& values, const Shape& shape,
                   const TensorOptions& options) {
  // std::vector<bool> holds bits, not bools: unpack into a bool tensor element by element.
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == NumElements(shape),
               "from_vector: ", values.size(), " values cannot fill shape ", ShapeToString(shape),
               " (", NumElements(shape), " elements)");
  Tensor host = NewTensor(shape, kBool, Device::Cpu(0));
  bool* data = host.data<bool>();
  for (size_t i = 0; i < values.size(); ++i) data[i] = values[i];
  Tensor out = host.to(options.dtype_.value_or(kBool)).to(options.device_);
  if (options.pinned_) out = out.pin_memory();
  return Finish(out, options);
}

Tensor from_blob(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                 std::function<void(void*)> deleter, const TensorOptions& options) {
  TANDEM_CHECK(strides.size() == shape.size(), "from_blob: shape ", ShapeToString(shape), " has ",
               shape.size(), " dimensions but strides ", ShapeToString(strides), " has ",
               strides.size(), "; give one stride (in elements) per dimension");
  TANDEM_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "from_blob: tensors have at most ",
               kMaxDims, " dimensions but shape ", ShapeToString(shape), " has ", shape.size());
  int64_t extent = 1;  // elements from the first to one past the last reachable one
  for (size_t i = 0; i < shape.size(); ++i) {
    TANDEM_CHECK(shape[i] >= 0, "from_blob: sizes must be >= 0 but shape is ",
                 ShapeToString(shape));
    TANDEM_CHECK(strides[i] >= 0, "from_blob: strides must be >= 0 but are ",
                 ShapeToString(strides), "; negative strides are not supported");
    if (shape[i] > 0) extent += (shape[i] - 1) * strides[i];
  }
  const int64_t numel = NumElements(shape);
  if (numel == 0) extent = 0;
  TANDEM_CHECK(data != nullptr || numel == 0, "from_blob: data is null but shape ",
               ShapeToString(shape), " has ", numel, " elements; pass the address of the memory");
  TANDEM_CHECK(!options.pinned_, "from_blob: the memory is the caller's, so Tandem cannot pin ",
               "it; drop .pinned(true) (or copy with .pin_memory() afterwards)");
  CheckAvailable(options.device_);
  const DType dtype = options.dtype_.value_or(kFloat32);
  auto storage = std::make_shared<Storage>();
  storage->bytes = static_cast<size_t>(extent) * ElementSize(dtype);
  storage->device = options.device_;
  if (deleter) {
    // shared_ptr calls the deleter itself if making its control block fails.
    storage->data = std::shared_ptr<void>(data, std::move(deleter));
  } else {
    storage->data = std::shared_ptr<void>(data, [](void*) {});
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Finish(Tensor(std::move(impl)), options);
}

Tensor from_blob(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                 const TensorOptions& options) {
  return from_blob(data, shape, strides, nullptr, options);
}

Tensor alias_on_cpu_device(const Tensor& tensor, Device device) {
  TANDEM_CHECK(tensor.defined(), "alias_on_cpu_device: expected a defined tensor");
  TANDEM_CHECK(tensor.device().is_cpu() && device.is_cpu(),
               "alias_on_cpu_device: only logical CPU devices share memory, but the tensor is on ",
               tensor.device(), " and the target is ", device, "; use to(device) to copy");
  const TensorImpl& source = *tensor.impl();
  auto storage = std::make_shared<Storage>(*source.storage);
  storage->device = device;
  storage->copy_on_write = true;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = source.offset;
  impl->shape = source.shape;
  impl->strides = source.strides;
  impl->dtype = source.dtype;
  return Tensor(std::move(impl));
}

void commit_alias_writes(const Tensor& original, const Tensor& alias) {
  TANDEM_CHECK(original.defined() && alias.defined(),
               "commit_alias_writes: expected two defined tensors");
  Storage& mine = *alias.impl()->storage;
  Storage& theirs = *original.impl()->storage;
  if (mine.copy_on_write || mine.data == theirs.data) return;  // never written
  TANDEM_CHECK(mine.bytes == theirs.bytes && original.storage_offset() == alias.storage_offset() &&
                   original.shape() == alias.shape() && original.dtype() == alias.dtype(),
               "commit_alias_writes: the alias was not made by alias_on_cpu_device(original, ...)");
  theirs.data = mine.data;
}

Tensor from_blob(void* data, const Shape& shape, std::function<void(void*)> deleter,
                 const TensorOptions& options) {
  return from_blob(data, shape, ContiguousStrides(shape), std::move(deleter), options);
}

Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options) {
  return from_blob(data, shape, ContiguousStrides(shape), nullptr, options);
}

Tensor arange(int64_t n, const TensorOptions& options) {
  TANDEM_CHECK(n >= 0, "arange: n must be >= 0 but is ", n);
  std::vector<int64_t> values(n);
  std::iota(values.begin(), values.end(), int64_t{0});
  return from_vector(values, {n}, options);
}

// ---- Random numbers --------------------------------------------------------------------

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = base_offset_;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

GeneratorState Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return GeneratorState{seed_, offset_};
}

void Generator::set_state(const GeneratorState& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = state.seed;
  offset_ = state.offset;
}

uint64_t Generator::Reserve(uint64_t n) { return Claim(n).offset; }

GeneratorState Generator::Claim(uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  const GeneratorState claimed{seed_, offset_};
  // Whole Philox blocks per request, so that requests never share a block.
  offset_ += (n + 3) / 4 * 4;
  return claimed;
}

uint64_t DeviceOffsetBase(int device_index) {
  TANDEM_CHECK(device_index >= 0 &&
                   static_cast<uint64_t>(device_index) < (uint64_t{1} << (64 - kDeviceOffsetShift)),
               "random numbers: expected a device index in [0, 2^", 64 - kDeviceOffsetShift,
               ") but got ", device_index, "; use a device such as cpu:0 or cuda:1");
  return static_cast<uint64_t>(device_index) << kDeviceOffsetShift;
}

// Generators are owned by `owned` (under `mutex`); the first kFastSlots indices of each
// device type are also cached in `fast`, read without a lock. A generator, once made, lives
// as long as the set, so cached pointers never dangle.
struct DeviceGenerators::Impl {
  static constexpr int kFastSlots = 64;

  mutable std::mutex mutex;
  uint64_t seed;
  std::map<Device, std::unique_ptr<Generator>> owned;
  std::atomic<Generator*> fast[kNumDeviceTypes][kFastSlots] = {};

  std::atomic<Generator*>* FastSlot(Device device) {
    const int type = static_cast<int>(device.type());
    if (type < 0 || type >= kNumDeviceTypes || device.index() < 0 || device.index() >= kFastSlots) {
      return nullptr;
    }
    return &fast[type][device.index()];
  }
};

DeviceGenerators::DeviceGenerators(uint64_t seed) : impl_(std::make_unique<Impl>()) {
  impl_->seed = seed;
}

DeviceGenerators::~DeviceGenerators() = default;

Generator& DeviceGenerators::get(Device device) {
  std::atomic<Generator*>* slot = impl_->FastSlot(device);
  if (slot != nullptr) {
    if (Generator* cached = slot->load(std::memory_order_acquire)) return *cached;
  }
  const uint64_t base = DeviceOffsetBase(device.index());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::unique_ptr<Generator>& generator = impl_->owned[device];
  if (generator == nullptr) generator = std::make_unique<Generator>(impl_->seed, base);
  if (slot != nullptr) slot->store(generator.get(), std::memory_order_release);
  return *generator;
}

void DeviceGenerators::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->seed = seed;
  for (auto& [device, generator] : impl_->owned) generator->manual_seed(seed);
}

uint64_t DeviceGenerators::seed() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->seed;
}

namespace {

DeviceGenerators& DefaultGenerators() {
  static DeviceGenerators* generators = new DeviceGenerators(0);  // never destroyed
  return *generators;
}

}  // namespace

Generator& default_generator(Device device) { return DefaultGenerators().get(device); }

Generator& default_generator() { return default_generator(Device::Cpu(0)); }

void manual_seed(uint64_t seed) { DefaultGenerators().manual_seed(seed); }

namespace {

Tensor RandomTensor(const Shape& shape, const TensorOptions& options, Generator* gen, bool normal,
                    double a, double b) {
  const DType dtype = options.dtype_.value_or(kFloat32);
  TANDEM_CHECK(IsFloatingPoint(dtype),
               "random tensors are floating-point (float32, float64, bfloat16 or float16); ",
               "got dtype ", dtype, ": draw floats and convert with .to(", dtype, ")");
  Tensor t = NewTensor(shape, dtype, options.device_, options.pinned_);
  Generator& g = gen != nullptr ? *gen : default_generator(t.device());
  const GeneratorState claimed = g.Claim(static_cast<uint64_t>(t.numel()));
  if (t.numel() > 0) {
    Backend& backend = GetBackend(t.device());
    const int index = t.device().index();
    if (normal) {
      backend.RandomNormal(index, dtype, t.raw_data(), t.numel(), claimed.seed, claimed.offset, a,
                           b);
    } else {
      backend.RandomUniform(index, dtype, t.raw_data(), t.numel(), claimed.seed, claimed.offset, a,
                            b);
    }
  }
  return Finish(t, options);
}

}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* gen) {
  return RandomTensor(shape, options, gen, /*normal=*/false, 0.0, 1.0);
}

Tensor randn(const Shape& shape, const TensorOptions& options, Generator* gen) {
  return RandomTensor(shape, options, gen, /*normal=*/true, 0.0, 1.0);
}

Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& options,
               Generator* gen) {
  TANDEM_CHECK(low <= high, "uniform: low (", low, ") must not exceed high (", high, ")");
  return RandomTensor(shape, options, gen, /*normal=*/false, low, high);
}

Tensor randperm(int64_t n, Generator* gen) {
  TANDEM_CHECK(n >= 0, "randperm: n must be >= 0 but is ", n);
  Generator& g = gen != nullptr ? *gen : default_generator(Device::Cpu(0));
  const GeneratorState claimed = g.Claim(static_cast<uint64_t>(n));
  const uint64_t offset = claimed.offset;
  const uint64_t key = claimed.seed ^ 0x5851F42D4C957F2Dull;  // a stream of its own
  std::vector<int64_t> values(n);
  std::iota(values.begin(), values.end(), int64_t{0});
  // Fisher-Yates with 64 random bits per swap: the modulo bias is below 2^-40 for any n
  // that fits in memory.
  for (int64_t i = n - 1; i > 0; --i) {
    const philox::Block block = philox::Generate(key, offset + static_cast<uint64_t>(i));
    const uint64_t bits = (static_cast<uint64_t>(block.x[0]) << 32) | block.x[1];
    std::swap(values[i], values[bits % static_cast<uint64_t>(i + 1)]);
  }
  return from_vector(values, {n}, TensorOptions().dtype(kInt64));
}

}  // namespace tandem
