// KernelStub: a kernel declared once and registered by each backend beside its code, as
// PyTorch's DispatchStub. The Backend interface (backend.h) keeps the runtime (memory,
// copies, streams, events) and the generic primitives every op is built from; an op's own
// kernel (pooling, attention, a fused optimizer, ...) is a stub instead, so that adding one
// touches its declaration, its kernels and its registrations, and no interface class.
//
//   // tensor/kernels/triangle_kernels.h: the declaration, what every backend implements.
//   TANDEM_DECLARE_KERNEL(TriangleKernel, void(int index, DType dtype, bool lower, ...));
//   // tensor/kernels/triangle_kernels.cc: the one definition.
//   TANDEM_DEFINE_KERNEL(TriangleKernel);
//   // tensor/cpu/triangle_kernels.cc, tensor/cuda/triangle_kernels.cc: each backend's.
//   TANDEM_REGISTER_KERNEL(TriangleKernel, DeviceType::kCPU, CpuTriangle);
//   // The op: calls the kernel of x's device type with the device's index.
//   TriangleKernel(x.device(), x.dtype(), lower, ...);
//
// A device type without a registered kernel gets a tandem::Error naming the kernel and the
// types that have one; `Find` lets an op fall back where that is right (an optional kernel,
// such as a backend's own convolution). Registration happens during static initialisation
// (link the registering library `alwayslink`), so lookups after main() starts need no lock.
#ifndef TANDEM_TENSOR_RUNTIME_KERNEL_STUB_H_
#define TANDEM_TENSOR_RUNTIME_KERNEL_STUB_H_

#include <string>
#include <vector>

#include "tensor/base/device.h"

namespace tandem {

// What every stub has whatever its signature: its name and which device types registered a
// kernel. AllKernelStubs() lists every defined stub, so that a test can require a row for each.
class KernelStubBase {
 public:
  constexpr explicit KernelStubBase(const char* name) : name_(name), registered_{} {}
  KernelStubBase(const KernelStubBase&) = delete;
  KernelStubBase& operator=(const KernelStubBase&) = delete;

  const char* name() const { return name_; }
  bool has(DeviceType type) const { return registered_[static_cast<int>(type)]; }
  // "cpu, cuda", or "none", for error messages.
  std::string registered_types() const;

 protected:
  // Aborts, naming the stub and the type, when `type` already has a kernel: two kernels for
  // one device type is a link-time mistake that no caller could recover from.
  void MarkRegistered(DeviceType type);
  [[noreturn]] void ThrowMissing(Device device) const;

 private:
  const char* name_;
  bool registered_[kNumDeviceTypes];
};

template <typename Signature>
class KernelStub;

// Kernels take the device's index first; the remaining arguments are the stub's own.
template <typename Ret, typename... Args>
class KernelStub<Ret(int, Args...)> : public KernelStubBase {
 public:
  using Fn = Ret (*)(int index, Args...);

  constexpr explicit KernelStub(const char* name) : KernelStubBase(name), fns_{} {}

  void Register(DeviceType type, Fn fn) {
    MarkRegistered(type);
    fns_[static_cast<int>(type)] = fn;
  }
  // The kernel of `type`, or nullptr when it has none.
  Fn Find(DeviceType type) const { return fns_[static_cast<int>(type)]; }

  Ret operator()(Device device, Args... args) const {
    const Fn fn = Find(device.type());
    if (fn == nullptr) ThrowMissing(device);
    return fn(device.index(), args...);
  }

 private:
  Fn fns_[kNumDeviceTypes];
};

// Every stub defined with TANDEM_DEFINE_KERNEL in the program, in no particular order.
const std::vector<const KernelStubBase*>& AllKernelStubs();

namespace internal {
struct KernelStubListing {
  explicit KernelStubListing(const KernelStubBase* stub);
};
struct KernelRegistration {
  template <typename Stub, typename Fn>
  KernelRegistration(Stub& stub, DeviceType type, Fn fn) {
    stub.Register(type, fn);
  }
};
}  // namespace internal

}  // namespace tandem

#define TANDEM_KERNEL_STUB_CONCAT_INNER(a, b) a##b
#define TANDEM_KERNEL_STUB_CONCAT(a, b) TANDEM_KERNEL_STUB_CONCAT_INNER(a, b)

// In a header, at namespace scope: `name` is a KernelStub with kernels of type `signature`
// (whose first parameter is the device index, an int).
#define TANDEM_DECLARE_KERNEL(name, signature) \
  struct name##_Signature {                    \
    using type = signature;                    \
  };                                           \
  extern ::tandem::KernelStub<signature> name

// In one .cc file, in the namespace of the declaration.
#define TANDEM_DEFINE_KERNEL(name)                                              \
  ::tandem::KernelStub<name##_Signature::type> name(#name);                     \
  static const ::tandem::internal::KernelStubListing TANDEM_KERNEL_STUB_CONCAT( \
      tandem_kernel_stub_listing_, name)(&name)

// Beside a backend's kernel, at namespace scope: `fn` is `stub`'s kernel for `device_type`.
#define TANDEM_REGISTER_KERNEL(stub, device_type, fn)                            \
  static const ::tandem::internal::KernelRegistration TANDEM_KERNEL_STUB_CONCAT( \
      tandem_kernel_registration_, __COUNTER__)(stub, device_type, fn)

#endif  // TANDEM_TENSOR_RUNTIME_KERNEL_STUB_H_
