// Module: the base of every layer and model, after PyTorch's C++ frontend (libtorch).
//
// A module registers its parameters (tensors that training updates), buffers (tensors that
// are state but not trained) and submodules by name, in order. The registry is what
// parameters(), to(), train()/eval(), zero_grad(), printing, checkpoints and clone() walk.
// A module keeps a *handle* (nn::Parameter / nn::Buffer) to each registered tensor and
// reads the tensor through it in forward(), so that whatever replaces the registered
// tensor — to(device), a checkpoint load, or DataParallel giving a replica broadcast copies
// with replace_parameter() — is what forward() uses.
//
// A user-defined module with a two-input forward (using namespace tandem):
//
//   class TwoTower : public nn::Cloneable<TwoTower> {
//    public:
//     TwoTower(int64_t x_features, int64_t y_features)
//         : x_features_(x_features), y_features_(y_features) {
//       reset();
//     }
//     // Creates and registers everything; clone() calls it again on the copy.
//     void reset() override {
//       left_ = register_module("left", nn::Linear(x_features_, 8));
//       right_ = register_module("right", nn::Linear(y_features_, 8));
//       scale_ = register_parameter("scale", tandem::ones({8}));
//     }
//     Tensor forward(const Tensor& x, const Tensor& y) {
//       return (left_->forward(x) + right_->forward(y)) * *scale_;
//     }
//
//    private:
//     int64_t x_features_, y_features_;
//     std::shared_ptr<nn::Linear> left_, right_;
//     nn::Parameter scale_;
//   };
//
//   auto model = std::make_shared<TwoTower>(4, 3);
//   Tensor out = model->forward(x, y);               // typed call
//   std::vector<Tensor> outs = model->forward_tensors({x, y});   // generic call
//   std::shared_ptr<nn::Module> replica = model->clone(Device::Cpu(1));
//   std::cout << *model;                             // PyTorch's format
//
// Cloneable<Derived> supplies clone() and the generic forward_tensors() from the typed
// forward (any number of tensor arguments, returning a Tensor or a vector of them).
//
// A replica for data parallelism is replicate_structure(copies): the module's structure
// cloned afresh, each parameter and buffer bound to its broadcast copy (parameters' copies
// carry a grad_fn back to the original).
// Modules are not synchronised: do not change one module from several threads at once;
// distinct modules (such as replicas) may run forward() concurrently.
#ifndef TANDEM_NN_MODULE_H_
#define TANDEM_NN_MODULE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/tensor.h"

namespace tandem::nn {

class Module;

struct NamedTensor {
  std::string name;  // dotted path from the module it was asked of, e.g. "fc1.weight"
  Tensor value;
};

// What load_state_dict found but did not use: names the module has and the dictionary
// lacks (missing_keys), and names in the dictionary the module does not have
// (unexpected_keys). Both are empty after a strict load, which throws otherwise.
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

struct NamedModule {
  std::string name;
  std::shared_ptr<Module> module;
};

// One registry entry's tensor, shared by the module and every handle to it.
struct TensorSlot {
  Tensor value;
  std::function<void()> read_hook;  // see TensorHandle::set_read_hook
};

// A module's handle to one of its registered tensors. It behaves like a pointer to the
// tensor currently registered under that name: when the module replaces the tensor
// (to(), replace_parameter(), load), every copy of the handle sees the new one. Only
// Module::register_parameter / register_buffer make handles that refer to something.
class TensorHandle {
 public:
  TensorHandle() = default;

  // True once it refers to a registered tensor.
  explicit operator bool() const { return slot_ != nullptr; }
  const Tensor& operator*() const { return get(); }
  const Tensor* operator->() const { return &get(); }
  const Tensor& get() const;

  // For wrappers that keep a module's parameters elsewhere between forward passes
  // (FullyShardedDataParallel keeps one shard of them per rank): `hook` runs before every
  // read through a handle to this entry (a module's forward reads its tensors so) and may
  // rebind() the entry to what the read should see. nullptr removes it.
  void set_read_hook(std::function<void()> hook) const;
  // Makes the entry refer to `value` without the checks of Module::replace_parameter (a
  // wrapper may bind a bfloat16 copy of a float32 parameter, for mixed precision).
  void rebind(Tensor value) const;
  // The tensor, without running the read hook.
  const Tensor& peek() const;

 private:
  friend class Module;
  explicit TensorHandle(std::shared_ptr<TensorSlot> slot) : slot_(std::move(slot)) {}
  std::shared_ptr<TensorSlot> slot_;
};

using Parameter = TensorHandle;
using Buffer = TensorHandle;

class Module {
 public:
  // `name` is what printing shows ("Linear"); by default, the class name of the object.
  explicit Module(std::string name = "");
  virtual ~Module() = default;

  // Copying a module is shallow, as copying a Tensor is: the copy shares its parameters,
  // buffers and submodules with the original. clone() makes a deep copy.
  Module(const Module&) = default;
  Module& operator=(const Module&) = default;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;

  // The class name ("Linear", "TwoTower") or the name given to the constructor.
  std::string name() const;

  // ---- Forward -------------------------------------------------------------------------
  // The generic entry point (DataParallel and Sequential call this): tensors in, tensors
  // out. Cloneable<Derived> implements it by calling Derived's typed forward(...); the
  // default throws, naming the module. (A distinct name, so that a typed forward in a
  // derived class does not hide it.)
  virtual std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs);

  // ---- Registration --------------------------------------------------------------------
  // Names are non-empty, contain no '.', and are unique among a module's parameters,
  // buffers and submodules. A parameter must be a floating-point leaf; it is marked
  // requires_grad(requires_grad) in place.
  Parameter register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Buffer register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "register_module takes a Module");
    RegisterChild(name, module);
    return module;
  }
  // Registers a module given by value: register_module("fc", nn::Linear(4, 8)).
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>>>
  std::shared_ptr<std::decay_t<M>> register_module(const std::string& name, M&& module) {
    return register_module(name, std::make_shared<std::decay_t<M>>(std::forward<M>(module)));
  }

  // ---- Inspection ----------------------------------------------------------------------
  // Parameters of this module and (if recurse) its descendants, depth first in
  // registration order, each once even if registered under several names.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<NamedTensor> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  // The handle of every parameter entry by dotted name, depth first in registration order,
  // a tensor registered in several places under each of its names (for wrappers that rebind
  // parameters: see TensorHandle::set_read_hook).
  std::vector<std::pair<std::string, Parameter>> named_parameter_handles() const;
  const std::vector<NamedModule>& named_children() const { return children_; }
  // This module and all its descendants, pre-order (this first). Non-owning.
  std::vector<Module*> modules();
  std::vector<const Module*> modules() const;
  // The registered parameter or buffer with this dotted name ("fc1.weight"); throws
  // naming the module and what it has when there is none.
  Tensor parameter(const std::string& dotted_name) const;
  Tensor buffer(const std::string& dotted_name) const;

  // ---- State dictionaries (PyTorch's state_dict / load_state_dict) ------------------------
  // Every parameter, then every buffer, by dotted name in registration order, detached and
  // sharing storage with the module (copy or clone them to keep a snapshot).
  //   std::vector<nn::NamedTensor> state = model.state_dict();   // {"fc1.weight", ...}
  //   other.load_state_dict(state);
  std::vector<NamedTensor> state_dict() const;
  // Copies `state` into the parameters and buffers of the same names (converting device,
  // not shape or dtype). Strict: every name must match both ways, or nothing is loaded and
  // the error lists the missing and unexpected names. Non-strict: unmatched names are
  // skipped and returned. A shape or dtype mismatch, or a name given twice, always throws
  // (nothing loaded).
  LoadStateDictResult load_state_dict(const std::vector<NamedTensor>& state, bool strict = true);

  // ---- State ---------------------------------------------------------------------------
  bool is_training() const { return training_; }
  // Sets training mode on this module and all descendants (Dropout is active only then).
  virtual void train(bool on = true);
  void eval() { train(false); }
  // Moves every parameter and buffer to `device` in place: each is replaced by a copy on
  // the device, parameters keeping requires_grad and their gradients moving along. The
  // copies are leaves (a parameter replaced by a non-leaf becomes a leaf again). Tensors
  // registered in several places stay shared. Handles follow; Tensors obtained earlier
  // from parameters() (e.g. held by an optimizer) do not, so move a module first.
  void to(Device device);
  // Converts every floating-point parameter and buffer to `dtype` in place, as to(device)
  // moves them (PyTorch's module.to(torch.float64), module.double()); integral buffers keep
  // their dtype.
  //   model->to(kFloat64);   // then feed it float64 inputs
  void to(DType dtype);
  // Clears the gradients of all parameters (set_to_none: drop them; else fill with 0). On a
  // replica it does nothing (its parameters are copies whose gradients flow to the
  // original) and warns once per process, as PyTorch's DataParallel replicas do.
  void zero_grad(bool set_to_none = true);

  // Replaces the tensor registered under a dotted name (e.g. "fc1.weight") with `value`,
  // which must have the same shape and dtype. `value` may be a non-leaf — DataParallel
  // gives each replica broadcast copies whose gradients flow back to the original — and
  // its requires_grad is left as it is. Every handle to the entry sees `value` afterwards.
  void replace_parameter(const std::string& dotted_name, Tensor value);
  void replace_buffer(const std::string& dotted_name, Tensor value);

  // ---- Cloning -------------------------------------------------------------------------
  // A deep copy (structure, values, training mode) with its tensors on `device` (each on
  // its own device if none), sharing no storage with this module. Implemented by
  // Cloneable<Derived> and by containers (Sequential); the default throws, explaining.
  virtual std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const;

  // ---- Replication (DataParallel) ------------------------------------------------------
  // Original tensor -> the tensor a replica uses instead (see replicate_structure).
  using TensorBindings = std::unordered_map<const TensorImpl*, Tensor>;
  // A fresh copy of this module's structure (clone(), so plain C++ members, submodules and
  // training modes are as they are now) whose every parameter and buffer is
  // bindings.at(the original's tensor), with no tensor copied: tensors registered in several
  // places stay shared. Every module of the copy is a replica (is_replica()). Throws, naming
  // the entry, when clone() built a different structure or a tensor has no binding.
  std::shared_ptr<Module> replicate_structure(const TensorBindings& bindings) const;
  bool is_replica() const { return replica_; }

  // ---- Printing ------------------------------------------------------------------------
  // Writes what goes between the parentheses after the name, e.g.
  // "in_features=10, out_features=5, bias=True" (PyTorch's extra_repr). Default: nothing.
  virtual void pretty_print(std::ostream& out) const;
  // The whole module tree in PyTorch's format (what operator<< prints).
  std::string ToString() const;

 protected:
  // True on this thread while clone() runs reset() on a copy, whose values are overwritten
  // right after: reset() may skip random initialisation then (saves time, and leaves the
  // random number stream as it was).
  static bool cloning();

  // For clone implementations: forgets every registration (the handles held by a derived
  // class keep pointing at the old entries until reset() re-registers).
  void ClearRegistrations();
  // Copies values, training mode and settings (CopySettingsFrom) from `original`, which must
  // have the same registered names, shapes and dtypes; recurses into submodules. Throws naming
  // what differs.
  void CopyStateFrom(const Module& original, std::optional<Device> device);
  // Takes over from `original` (a module of the same type) what a caller set on it after
  // construction and reset() does not rebuild, so that clones and DataParallel's replicas
  // of submodules keep it too (a BatchNorm's cross-replica sum). Default: nothing.
  virtual void CopySettingsFrom(const Module& /*original*/) {}

  // RAII marker for cloning().
  class CloningScope {
   public:
    CloningScope();
    ~CloningScope();
    CloningScope(const CloningScope&) = delete;
    CloningScope& operator=(const CloningScope&) = delete;
  };

 private:
  struct Entry {
    std::string name;
    std::shared_ptr<TensorSlot> slot;
  };
  enum class Kind { kParameter, kBuffer };
  // Maps an original tensor to its copy, so that a tensor registered in several places is
  // copied once and stays shared.
  using CopyMemo = std::unordered_map<const TensorImpl*, Tensor>;

  std::vector<Entry>& EntriesOf(Kind kind) {
    return kind == Kind::kParameter ? parameters_ : buffers_;
  }
  const std::vector<Entry>& EntriesOf(Kind kind) const {
    return kind == Kind::kParameter ? parameters_ : buffers_;
  }
  void CheckNewName(const std::string& name, const char* what) const;
  void RegisterChild(const std::string& name, std::shared_ptr<Module> module);
  void CollectTensors(Kind kind, const std::string& prefix, bool recurse,
                      std::vector<NamedTensor>& out,
                      std::unordered_set<const TensorImpl*>& seen) const;
  // The registry entry for a dotted name, or throws naming what exists.
  const Entry& FindEntry(Kind kind, const std::string& dotted_name) const;
  void ReplaceEntry(Kind kind, const std::string& dotted_name, Tensor value);
  // Replaces every parameter and buffer t by convert(t) (to another device or dtype);
  // convert returns t itself to leave it alone.
  using TensorConversion = std::function<Tensor(const Tensor&)>;
  void Convert(const TensorConversion& convert);
  void PlanConversion(const TensorConversion& convert, CopyMemo& converted,
                      std::vector<std::pair<std::shared_ptr<TensorSlot>, Tensor>>& plan) const;
  void CopyStateRecursive(const Module& original, std::optional<Device> device,
                          const std::string& path, CopyMemo& copied);
  // replicate_structure's second half: binds this copy's entries, module by module.
  void BindReplica(const Module& original, const TensorBindings& bindings, const std::string& path);

  std::string explicit_name_;
  std::vector<Entry> parameters_;
  std::vector<Entry> buffers_;
  std::vector<NamedModule> children_;
  bool training_ = true;
  bool replica_ = false;
};

std::ostream& operator<<(std::ostream& out, const Module& module);

namespace internal {

[[noreturn]] void ThrowForwardArity(const std::string& module, size_t given,
                                    const std::vector<size_t>& accepted);

template <size_t>
using TensorArg = const Tensor&;

template <typename M, typename Indices, typename = void>
struct ForwardResult {
  using type = void;
};
template <typename M, size_t... I>
struct ForwardResult<
    M, std::index_sequence<I...>,
    std::void_t<decltype(std::declval<M&>().forward(std::declval<TensorArg<I>>()...))>> {
  using type = decltype(std::declval<M&>().forward(std::declval<TensorArg<I>>()...));
};

// Whether M has a forward taking N tensors and returning Tensor or std::vector<Tensor>.
template <typename M, size_t N>
constexpr bool kHasForward =
    std::is_same_v<typename ForwardResult<M, std::make_index_sequence<N>>::type, Tensor> ||
    std::is_same_v<typename ForwardResult<M, std::make_index_sequence<N>>::type,
                   std::vector<Tensor>>;

inline constexpr size_t kMaxForwardArity = 8;

inline std::vector<Tensor> AsOutputs(Tensor out) { return {std::move(out)}; }
inline std::vector<Tensor> AsOutputs(std::vector<Tensor> outs) { return outs; }

template <typename M, size_t... I>
std::vector<Tensor> CallForward(M& module, const std::vector<Tensor>& inputs,
                                std::index_sequence<I...>) {
  return AsOutputs(module.forward(inputs[I]...));
}

template <typename M, size_t N = 0>
std::vector<Tensor> DispatchForward(M& module, const std::vector<Tensor>& inputs,
                                    std::vector<size_t> accepted = {}) {
  if constexpr (N > kMaxForwardArity) {
    ThrowForwardArity(module.name(), inputs.size(), accepted);
  } else {
    if constexpr (kHasForward<M, N>) {
      if (inputs.size() == N) return CallForward(module, inputs, std::make_index_sequence<N>());
      accepted.push_back(N);
    }
    return DispatchForward<M, N + 1>(module, inputs, std::move(accepted));
  }
}

}  // namespace internal

// The base for modules that can be cloned, as libtorch's Cloneable: Derived creates and
// registers all its parameters, buffers and submodules in reset() (and its constructor
// calls reset()). clone() copies Derived (configuration members), forgets the copy's
// registrations, runs reset() on it — which re-binds every handle and submodule pointer
// to fresh objects — and copies the values over, after checking that reset() registered
// exactly what the original has (a parameter registered outside reset() is reported).
// Tensors a module keeps without registering them are invisible to all of this: they are
// not moved, cloned, trained or saved, so register every tensor that forward() reads.
//
// It also implements forward_tensors() by calling Derived's public forward with as many
// tensor arguments as it was given (up to 8), so a module only writes its typed forward.
template <typename Derived>
class Cloneable : public Module {
 public:
  using Module::Module;

  // Creates and registers this module's parameters, buffers and submodules.
  virtual void reset() = 0;

  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const override {
    static_assert(std::is_copy_constructible_v<Derived>,
                  "clone() copies Derived's configuration with its copy constructor: make it "
                  "copyable (hold non-copyable members through std::shared_ptr)");
    NoGradGuard no_grad;
    auto copy = std::make_shared<Derived>(static_cast<const Derived&>(*this));
    copy->ClearRegistrations();
    {
      CloningScope scope;
      copy->reset();
    }
    copy->CopyStateFrom(*this, device);
    return copy;
  }

  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override {
    return internal::DispatchForward(static_cast<Derived&>(*this), inputs);
  }
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_MODULE_H_
