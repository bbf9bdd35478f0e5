#include "nn/sequential.h"

#include <string>

namespace tandem::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (std::shared_ptr<Module>& module : modules) push_back(std::move(module));
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  TANDEM_CHECK(index < size(), "Sequential: index ", index, " is out of range for ", size(),
               " modules");
  return named_children()[index].module;
}

void Sequential::CheckType(size_t index, bool ok) const {
  TANDEM_CHECK(ok, "Sequential: module (", index, ") is a ", (*this)[index]->name(),
               ", not the type asked for");
}

Tensor Sequential::forward(const Tensor& input) {
  std::vector<Tensor> outputs = forward_tensors({input});
  TANDEM_CHECK(outputs.size() == 1, "Sequential.forward(Tensor): the last module returned ",
               outputs.size(), " tensors; call forward_tensors() to get them all");
  return outputs[0];
}

std::vector<Tensor> Sequential::forward_tensors(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> values = inputs;
  for (const NamedModule& child : named_children()) values = child.module->forward_tensors(values);
  return values;
}

std::shared_ptr<Module> Sequential::clone(std::optional<Device> device) const {
  // The shallow copy keeps the name and training mode; its shared children are then
  // replaced by clones.
  auto copy = std::make_shared<Sequential>(*this);
  copy->ClearRegistrations();
  for (const NamedModule& child : named_children()) copy->push_back(child.module->clone(device));
  return copy;
}

// ---- ModuleList ------------------------------------------------------------------------

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) {
  for (std::shared_ptr<Module>& module : modules) push_back(std::move(module));
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  TANDEM_CHECK(module != nullptr, "ModuleList: cannot append a null module (position ", size(),
               ")");
  register_module(std::to_string(size()), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<Module> ModuleList::operator[](size_t index) const {
  TANDEM_CHECK(index < size(), "ModuleList: index ", index, " is out of range for ", size(),
               " modules");
  return modules_[index];
}

void ModuleList::CheckType(size_t index, bool ok) const {
  TANDEM_CHECK(ok, "ModuleList: module (", index, ") is a ", (*this)[index]->name(),
               ", not the type asked for");
}

std::shared_ptr<Module> ModuleList::clone(std::optional<Device> device) const {
  auto copy = std::make_shared<ModuleList>(*this);
  copy->ClearRegistrations();
  copy->modules_.clear();
  for (const std::shared_ptr<Module>& module : modules_) copy->push_back(module->clone(device));
  return copy;
}

}  // namespace tandem::nn
