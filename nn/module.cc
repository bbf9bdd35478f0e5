#include "nn/module.h"

#include <cxxabi.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <typeinfo>

#include "tensor/runtime/devices.h"

namespace tandem::nn {
namespace {

thread_local int clone_depth = 0;
// Set while replicate_structure() clones: the copy's entries share the original's tensors
// (rebound right after), so no tensor is copied.
thread_local bool clone_shares_tensors = false;

std::atomic<bool> replica_zero_grad_warned{false};

// "tandem::nn::Linear" -> "Linear", keeping template arguments whole.
std::string UnqualifiedName(const std::string& qualified) {
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i < qualified.size(); ++i) {
    const char c = qualified[i];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (depth == 0 && c == ':' && i + 1 < qualified.size() && qualified[i + 1] == ':') {
      start = i + 2;
    }
  }
  return qualified.substr(start);
}

std::string DemangledTypeName(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : type.name();
  std::free(demangled);
  return UnqualifiedName(name);
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Python's torch.nn.modules.module._addindent: indents every line but the first.
std::string AddIndent(const std::string& text, int spaces) {
  const std::vector<std::string> lines = SplitLines(text);
  if (lines.size() <= 1) return text;
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + std::string(spaces, ' ') + lines[i];
  return out;
}

std::string JoinNames(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

const char* KindName(bool parameter) { return parameter ? "parameter" : "buffer"; }

}  // namespace

const Tensor& TensorHandle::get() const {
  TANDEM_CHECK(slot_ != nullptr,
               "this nn::Parameter/nn::Buffer handle refers to nothing: assign it the result of "
               "register_parameter() or register_buffer() (in reset(), for Cloneable modules)");
  if (slot_->read_hook) slot_->read_hook();
  return slot_->value;
}

const Tensor& TensorHandle::peek() const {
  TANDEM_CHECK(slot_ != nullptr, "this nn::Parameter/nn::Buffer handle refers to nothing");
  return slot_->value;
}

void TensorHandle::rebind(Tensor value) const {
  TANDEM_CHECK(slot_ != nullptr, "this nn::Parameter/nn::Buffer handle refers to nothing");
  slot_->value = std::move(value);
}

void TensorHandle::set_read_hook(std::function<void()> hook) const {
  TANDEM_CHECK(slot_ != nullptr, "this nn::Parameter/nn::Buffer handle refers to nothing");
  slot_->read_hook = std::move(hook);
}

Module::Module(std::string name) : explicit_name_(std::move(name)) {}

std::string Module::name() const {
  return explicit_name_.empty() ? DemangledTypeName(typeid(*this)) : explicit_name_;
}

std::vector<Tensor> Module::forward_tensors(const std::vector<Tensor>& inputs) {
  TANDEM_FAIL(name(), " does not implement forward_tensors() (it was called with ", inputs.size(),
              " tensors): derive it from nn::Cloneable<", name(),
              ">, which calls its typed forward(), or override forward_tensors()");
}

// ---- Registration ----------------------------------------------------------------------

bool Module::cloning() { return clone_depth > 0; }
Module::CloningScope::CloningScope() { ++clone_depth; }
Module::CloningScope::~CloningScope() { --clone_depth; }

void Module::CheckNewName(const std::string& entry_name, const char* what) const {
  TANDEM_CHECK(!entry_name.empty(), name(), ": cannot register a ", what, " with an empty name");
  TANDEM_CHECK(entry_name.find('.') == std::string::npos, name(), ": cannot register ", what, " '",
               entry_name,
               "': names must not contain '.' (it separates the levels of dotted names such as "
               "'fc1.weight')");
  auto check_free = [&](const std::string& existing, const char* existing_kind) {
    TANDEM_CHECK(existing != entry_name, name(), ": cannot register ", what, " '", entry_name,
                 "': a ", existing_kind, " of that name is already registered");
  };
  for (const Entry& e : parameters_) check_free(e.name, "parameter");
  for (const Entry& e : buffers_) check_free(e.name, "buffer");
  for (const NamedModule& c : children_) check_free(c.name, "submodule");
}

Parameter Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  CheckNewName(name, "parameter");
  TANDEM_CHECK(tensor.defined(), this->name(), ": register_parameter('", name,
               "') was given an undefined tensor");
  TANDEM_CHECK(IsFloatingPoint(tensor.dtype()), this->name(), ": parameter '", name,
               "' must be floating-point (float32 or float64: gradients are) but is ",
               tensor.dtype());
  TANDEM_CHECK(tensor.is_leaf(), this->name(), ": parameter '", name,
               "' must be a leaf tensor (gradients accumulate in leaves) but is the result of ",
               tensor.grad_fn()->name(), "; register tensor.detach() instead");
  tensor.set_requires_grad(requires_grad);
  auto slot = std::make_shared<TensorSlot>(TensorSlot{std::move(tensor), nullptr});
  parameters_.push_back({name, slot});
  return Parameter(std::move(slot));
}

Buffer Module::register_buffer(const std::string& name, Tensor tensor) {
  CheckNewName(name, "buffer");
  TANDEM_CHECK(tensor.defined(), this->name(), ": register_buffer('", name,
               "') was given an undefined tensor");
  auto slot = std::make_shared<TensorSlot>(TensorSlot{std::move(tensor), nullptr});
  buffers_.push_back({name, slot});
  return Buffer(std::move(slot));
}

void Module::RegisterChild(const std::string& name, std::shared_ptr<Module> module) {
  CheckNewName(name, "submodule");
  TANDEM_CHECK(module != nullptr, this->name(), ": register_module('", name,
               "') was given a null module");
  for (const Module* m : static_cast<const Module&>(*module).modules()) {
    TANDEM_CHECK(m != this, this->name(), ": cannot register submodule '", name,
                 "': it contains this module, which would make the module tree a cycle");
  }
  children_.push_back({name, std::move(module)});
}

// ---- Inspection ------------------------------------------------------------------------

void Module::CollectTensors(Kind kind, const std::string& prefix, bool recurse,
                            std::vector<NamedTensor>& out,
                            std::unordered_set<const TensorImpl*>& seen) const {
  for (const Entry& e : EntriesOf(kind)) {
    if (seen.insert(e.slot->value.impl()).second) out.push_back({prefix + e.name, e.slot->value});
  }
  if (!recurse) return;
  for (const NamedModule& c : children_) {
    c.module->CollectTensors(kind, prefix + c.name + ".", recurse, out, seen);
  }
}

std::vector<NamedTensor> Module::named_parameters(bool recurse) const {
  std::vector<NamedTensor> out;
  std::unordered_set<const TensorImpl*> seen;
  CollectTensors(Kind::kParameter, "", recurse, out, seen);
  return out;
}

std::vector<std::pair<std::string, Parameter>> Module::named_parameter_handles() const {
  std::vector<std::pair<std::string, Parameter>> out;
  std::function<void(const Module&, const std::string&)> collect = [&](const Module& m,
                                                                       const std::string& prefix) {
    for (const Entry& e : m.parameters_) out.emplace_back(prefix + e.name, Parameter(e.slot));
    for (const NamedModule& c : m.children_) collect(*c.module, prefix + c.name + ".");
  };
  collect(*this, "");
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (NamedTensor& p : named_parameters(recurse)) out.push_back(std::move(p.value));
  return out;
}

std::vector<NamedTensor> Module::named_buffers(bool recurse) const {
  std::vector<NamedTensor> out;
  std::unordered_set<const TensorImpl*> seen;
  CollectTensors(Kind::kBuffer, "", recurse, out, seen);
  return out;
}

std::vector<NamedTensor> Module::state_dict() const {
  std::vector<NamedTensor> out;
  for (const bool is_buffer : {false, true}) {
    for (NamedTensor& t : is_buffer ? named_buffers() : named_parameters()) {
      out.push_back({std::move(t.name), t.value.detach()});
    }
  }
  return out;
}

LoadStateDictResult Module::load_state_dict(const std::vector<NamedTensor>& state, bool strict) {
  std::unordered_map<std::string, Tensor> given;
  for (const NamedTensor& t : state) {
    TANDEM_CHECK(t.value.defined(), name(), ".load_state_dict: '", t.name,
                 "' is an undefined Tensor; give every entry a value");
    TANDEM_CHECK(given.emplace(t.name, t.value).second, name(), ".load_state_dict: '", t.name,
                 "' appears twice in the state dictionary");
  }
  LoadStateDictResult result;
  std::vector<std::string> mismatched;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (module tensor, given tensor)
  for (const NamedTensor& own : state_dict()) {
    auto it = given.find(own.name);
    if (it == given.end()) {
      result.missing_keys.push_back(own.name);
      continue;
    }
    const Tensor& value = it->second;
    if (value.shape() != own.value.shape() || value.dtype() != own.value.dtype()) {
      mismatched.push_back("'" + own.name + "' is " + ShapeToString(value.shape()) + " " +
                           DTypeName(value.dtype()) + " in the state dictionary but " +
                           ShapeToString(own.value.shape()) + " " + DTypeName(own.value.dtype()) +
                           " in the module");
    } else {
      copies.emplace_back(own.value, value);
    }
    given.erase(it);
  }
  for (const NamedTensor& t : state) {
    if (given.count(t.name) > 0) result.unexpected_keys.push_back(t.name);
  }
  std::string problems;
  for (const std::string& m : mismatched) problems += "\n  size mismatch: " + m;
  if (strict) {
    for (const std::string& k : result.missing_keys) problems += "\n  missing key: '" + k + "'";
    for (const std::string& k : result.unexpected_keys) {
      problems += "\n  unexpected key: '" + k + "'";
    }
  }
  TANDEM_CHECK(problems.empty(), "Error(s) in loading state_dict for ", name(),
               " (nothing was loaded):", problems,
               strict ? "\n(pass strict = false to load the matching entries only)" : "");
  NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
  return result;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (NamedTensor& b : named_buffers(recurse)) out.push_back(std::move(b.value));
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const NamedModule& c : children_) out.push_back(c.module);
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out = {this};
  for (const NamedModule& c : children_) {
    for (Module* m : c.module->modules()) out.push_back(m);
  }
  return out;
}

std::vector<const Module*> Module::modules() const {
  std::vector<const Module*> out = {this};
  for (const NamedModule& c : children_) {
    for (const Module* m : static_cast<const Module&>(*c.module).modules()) out.push_back(m);
  }
  return out;
}

const Module::Entry& Module::FindEntry(Kind kind, const std::string& dotted_name) const {
  const bool parameter = kind == Kind::kParameter;
  const Module* owner = this;
  std::string rest = dotted_name;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos;) {
    const std::string child_name = rest.substr(0, dot);
    const Module* next = nullptr;
    std::vector<std::string> names;
    for (const NamedModule& c : owner->children_) {
      names.push_back(c.name);
      if (c.name == child_name) next = c.module.get();
    }
    TANDEM_CHECK(next != nullptr, name(), " has no ", KindName(parameter), " '", dotted_name,
                 "': ", owner->name(), " has no submodule '", child_name,
                 "' (its submodules: ", JoinNames(names), ")");
    owner = next;
    rest = rest.substr(dot + 1);
  }
  std::vector<std::string> names;
  for (const Entry& e : owner->EntriesOf(kind)) {
    if (e.name == rest) return e;
    names.push_back(e.name);
  }
  TANDEM_FAIL(name(), " has no ", KindName(parameter), " '", dotted_name, "' (", owner->name(),
              "'s ", KindName(parameter), "s: ", JoinNames(names), ")");
}

Tensor Module::parameter(const std::string& dotted_name) const {
  return FindEntry(Kind::kParameter, dotted_name).slot->value;
}

Tensor Module::buffer(const std::string& dotted_name) const {
  return FindEntry(Kind::kBuffer, dotted_name).slot->value;
}

// ---- State -----------------------------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (const NamedModule& c : children_) c.module->train(on);
}

void Module::PlanConversion(
    const TensorConversion& convert, CopyMemo& converted,
    std::vector<std::pair<std::shared_ptr<TensorSlot>, Tensor>>& plan) const {
  for (Kind kind : {Kind::kParameter, Kind::kBuffer}) {
    for (const Entry& e : EntriesOf(kind)) {
      const Tensor& old = e.slot->value;
      auto it = converted.find(old.impl());
      if (it == converted.end()) {
        Tensor copy = convert(old);               // under NoGradGuard: records nothing
        if (copy.impl() == old.impl()) continue;  // already as asked
        copy = copy.detach();
        if (old.requires_grad()) copy.set_requires_grad(true);
        const Tensor grad = old.is_leaf() ? old.grad() : Tensor();
        if (grad.defined()) copy.set_grad(convert(grad));
        it = converted.emplace(old.impl(), std::move(copy)).first;
      }
      plan.emplace_back(e.slot, it->second);
    }
  }
  for (const NamedModule& c : children_) c.module->PlanConversion(convert, converted, plan);
}

void Module::Convert(const TensorConversion& convert) {
  NoGradGuard no_grad;
  // Copy everything first and swap in afterwards, so that a failed copy (out of memory)
  // leaves the module as it was.
  CopyMemo converted;
  std::vector<std::pair<std::shared_ptr<TensorSlot>, Tensor>> plan;
  PlanConversion(convert, converted, plan);
  for (auto& [slot, copy] : plan) slot->value = std::move(copy);
}

void Module::to(Device device) {
  CheckAvailable(device);
  Convert([device](const Tensor& t) { return t.to(device); });
}

void Module::to(DType dtype) {
  TANDEM_CHECK(IsFloatingPoint(dtype), name(), ".to(", dtype,
               "): a module converts its floating-point parameters and buffers, so the dtype ",
               "must be floating-point (float32, float64, bfloat16 or float16)");
  // As PyTorch's Module.to(dtype): integral buffers (BatchNorm's num_batches_tracked) stay.
  Convert([dtype](const Tensor& t) { return IsFloatingPoint(t.dtype()) ? t.to(dtype) : t; });
}

void Module::zero_grad(bool set_to_none) {
  if (replica_) {
    if (!replica_zero_grad_warned.exchange(true)) {
      std::cerr << "warning: Calling .zero_grad() from a module created with nn.DataParallel() "
                   "has no effect.\n";
    }
    return;
  }
  ZeroGrad(parameters(), set_to_none);
}

void Module::ReplaceEntry(Kind kind, const std::string& dotted_name, Tensor value) {
  const Entry& entry = FindEntry(kind, dotted_name);
  const Tensor& current = entry.slot->value;
  const char* what = KindName(kind == Kind::kParameter);
  TANDEM_CHECK(value.defined(), name(), ": cannot replace ", what, " '", dotted_name,
               "' with an undefined tensor");
  TANDEM_CHECK(value.shape() == current.shape() && value.dtype() == current.dtype(), name(),
               ": cannot replace ", what, " '", dotted_name, "' (", ShapeToString(current.shape()),
               " ", current.dtype(), ") with a tensor of a different shape or dtype (",
               ShapeToString(value.shape()), " ", value.dtype(), ")");
  entry.slot->value = std::move(value);
}

void Module::replace_parameter(const std::string& dotted_name, Tensor value) {
  ReplaceEntry(Kind::kParameter, dotted_name, std::move(value));
}

void Module::replace_buffer(const std::string& dotted_name, Tensor value) {
  ReplaceEntry(Kind::kBuffer, dotted_name, std::move(value));
}

// ---- Cloning ---------------------------------------------------------------------------

std::shared_ptr<Module> Module::clone(std::optional<Device> device) const {
  TANDEM_FAIL(name(), " cannot be cloned: derive it from nn::Cloneable<", name(),
              "> and create its parameters, buffers and submodules in reset(), or override "
              "clone()");
}

void Module::ClearRegistrations() {
  parameters_.clear();
  buffers_.clear();
  children_.clear();
}

void Module::CopyStateFrom(const Module& original, std::optional<Device> device) {
  if (device) CheckAvailable(*device);
  NoGradGuard no_grad;
  CopyMemo copied;
  CopyStateRecursive(original, device, "", copied);
}

void Module::CopyStateRecursive(const Module& original, std::optional<Device> device,
                                const std::string& path, CopyMemo& copied) {
  // The messages are built only on failure: DataParallel clones at every forward.
  const auto problem = [&original] { return "cannot clone " + original.name() + ": "; };
  static constexpr const char* advice =
      " (create and register every parameter, buffer and submodule in reset(), not in the "
      "constructor, so that clone() can rebuild the module)";

  // What reset() registered must be what the original has, name for name.
  auto check_names = [&](const char* what, const auto& want_entries, const auto& have_entries) {
    bool same = want_entries.size() == have_entries.size();
    for (size_t i = 0; same && i < want_entries.size(); ++i) {
      same = want_entries[i].name == have_entries[i].name;
    }
    if (same) return;
    for (const auto& n : want_entries) {
      bool found = false;
      for (const auto& h : have_entries) found = found || h.name == n.name;
      TANDEM_CHECK(found, problem(), "the original has ", what, " '", path + n.name,
                   "' but reset() did not register it", advice);
    }
    for (const auto& h : have_entries) {
      bool found = false;
      for (const auto& n : want_entries) found = found || h.name == n.name;
      TANDEM_CHECK(found, problem(), "reset() registered ", what, " '", path + h.name,
                   "' which the original does not have", advice);
    }
  };
  check_names("parameter", original.parameters_, parameters_);
  check_names("buffer", original.buffers_, buffers_);
  check_names("submodule", original.children_, children_);

  for (Kind kind : {Kind::kParameter, Kind::kBuffer}) {
    const char* what = KindName(kind == Kind::kParameter);
    for (const Entry& source_entry : original.EntriesOf(kind)) {
      const Tensor& source = source_entry.slot->value;
      Entry* target = nullptr;
      for (Entry& e : EntriesOf(kind)) {
        if (e.name == source_entry.name) target = &e;
      }
      const Tensor& rebuilt = target->slot->value;
      // reset() builds floating tensors in the default dtype; a module converted with
      // to(dtype) holds another floating dtype, which the copy takes from the original (as
      // PyTorch replicates a model.half()). Integral tensors must match: to(dtype) keeps them.
      const bool same_dtype = rebuilt.dtype() == source.dtype() ||
                              (IsFloatingPoint(rebuilt.dtype()) && IsFloatingPoint(source.dtype()));
      TANDEM_CHECK(rebuilt.shape() == source.shape() && same_dtype, problem(), what, " '",
                   path + source_entry.name, "' is ", ShapeToString(source.shape()), " ",
                   source.dtype(), " in the original but reset() made it ",
                   ShapeToString(rebuilt.shape()), " ", rebuilt.dtype(),
                   " (was a configuration member changed after construction?)");
      if (clone_shares_tensors) {
        target->slot->value = source;
        continue;
      }
      auto it = copied.find(source.impl());
      if (it == copied.end()) {
        const Tensor detached = source.detach();
        const Device where = device.value_or(source.device());
        Tensor copy = where == source.device() ? detached.clone() : detached.to(where);
        if (source.requires_grad()) copy.set_requires_grad(true);
        it = copied.emplace(source.impl(), std::move(copy)).first;
      }
      target->slot->value = it->second;
    }
  }

  for (const NamedModule& source_child : original.children_) {
    NamedModule* target = nullptr;
    for (NamedModule& c : children_) {
      if (c.name == source_child.name) target = &c;
    }
    const std::string child_path = path + source_child.name;
    TANDEM_CHECK(target->module != source_child.module, problem(), "reset() registered submodule '",
                 child_path,
                 "' that the original holds too, so the clone would share it instead of copying "
                 "it; create submodules inside reset() (e.g. with std::make_shared), or override "
                 "clone()");
    const Module& source_module = *source_child.module;
    const Module& target_module = *target->module;
    TANDEM_CHECK(typeid(source_module) == typeid(target_module), problem(), "submodule '",
                 child_path, "' is a ", source_module.name(),
                 " in the original but reset() made a ", target_module.name());
    target->module->CopyStateRecursive(*source_child.module, device, child_path + ".", copied);
  }
  training_ = original.training_;
  CopySettingsFrom(original);
}

// ---- Replication -----------------------------------------------------------------------

std::shared_ptr<Module> Module::replicate_structure(const TensorBindings& bindings) const {
  std::shared_ptr<Module> copy;
  {
    NoGradGuard no_grad;
    struct ShareTensorsWhileCloning {
      const bool outer = clone_shares_tensors;
      ShareTensorsWhileCloning() { clone_shares_tensors = true; }
      ~ShareTensorsWhileCloning() { clone_shares_tensors = outer; }
    } sharing;
    copy = clone();
  }
  TANDEM_CHECK(copy != nullptr && copy.get() != this, "cannot replicate ", name(),
               ": its clone() returned ", copy == nullptr ? "null" : "the module itself",
               "; it must return a new copy");
  copy->BindReplica(*this, bindings, "");
  return copy;
}

void Module::BindReplica(const Module& original, const TensorBindings& bindings,
                         const std::string& path) {
  const auto problem = [&original] {
    return "cannot replicate " + original.name() + ": its clone() ";
  };
  for (Kind kind : {Kind::kParameter, Kind::kBuffer}) {
    const char* what = KindName(kind == Kind::kParameter);
    const std::vector<Entry>& want = original.EntriesOf(kind);
    std::vector<Entry>& have = EntriesOf(kind);
    TANDEM_CHECK(want.size() == have.size(), problem(), "registered ", have.size(), " ", what,
                 "s at '", path, "' but the module has ", want.size(),
                 "; clone() must rebuild the same parameters, buffers and submodules");
    for (size_t i = 0; i < want.size(); ++i) {
      TANDEM_CHECK(want[i].name == have[i].name, problem(), "registered ", what, " '",
                   path + have[i].name, "' where the module has '", path + want[i].name,
                   "'; clone() must rebuild the same parameters, buffers and submodules");
      TANDEM_CHECK(want[i].slot != have[i].slot, problem(), "shares the entry of ", what, " '",
                   path + want[i].name,
                   "' with the module instead of registering its own (a shallow copy?); "
                   "clone() must rebuild the module's registrations");
      auto it = bindings.find(want[i].slot->value.impl());
      TANDEM_CHECK(it != bindings.end(), "replicate: no copy was made of ", what, " '",
                   path + want[i].name, "' of ", original.name(),
                   "; pass a binding for every tensor of named_parameters() and named_buffers()");
      have[i].slot->value = it->second;
    }
  }
  TANDEM_CHECK(original.children_.size() == children_.size(), problem(), "made ", children_.size(),
               " submodules at '", path, "' but the module has ", original.children_.size(),
               "; clone() must rebuild the same parameters, buffers and submodules");
  for (size_t i = 0; i < children_.size(); ++i) {
    const NamedModule& want = original.children_[i];
    NamedModule& have = children_[i];
    TANDEM_CHECK(want.name == have.name, problem(), "made submodule '", path + have.name,
                 "' where the module has '", path + want.name,
                 "'; clone() must rebuild the same parameters, buffers and submodules");
    TANDEM_CHECK(have.module != want.module, problem(), "shares submodule '", path + have.name,
                 "' with the module instead of copying it; clone() must rebuild every submodule");
    have.module->BindReplica(*want.module, bindings, path + want.name + ".");
  }
  replica_ = true;
}

// ---- Printing --------------------------------------------------------------------------

void Module::pretty_print(std::ostream& out) const {}

std::string Module::ToString() const {
  std::ostringstream extra;
  pretty_print(extra);
  const std::vector<std::string> extra_lines = SplitLines(extra.str());
  std::vector<std::string> lines = extra_lines;
  for (const NamedModule& c : children_) {
    lines.push_back("(" + c.name + "): " + AddIndent(c.module->ToString(), 2));
  }
  std::string out = name() + "(";
  if (extra_lines.size() == 1 && children_.empty()) {
    out += extra_lines[0];
  } else if (!lines.empty()) {
    for (const std::string& line : lines) out += "\n  " + line;
    out += "\n";
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& out, const Module& module) {
  return out << module.ToString();
}

namespace internal {

void ThrowForwardArity(const std::string& module, size_t given,
                       const std::vector<size_t>& accepted) {
  if (accepted.empty()) {
    TANDEM_FAIL(module, " has no public forward() taking up to ", kMaxForwardArity,
                " tensors and returning a Tensor or std::vector<Tensor>, so it cannot be called "
                "with ",
                given, " tensors; declare one, or override forward_tensors()");
  }
  std::string counts;
  for (size_t n : accepted) counts += (counts.empty() ? "" : " or ") + std::to_string(n);
  TANDEM_FAIL(module, ".forward() takes ", counts, " tensor", accepted.back() == 1 ? "" : "s",
              " but was given ", given);
}

}  // namespace internal
}  // namespace tandem::nn
