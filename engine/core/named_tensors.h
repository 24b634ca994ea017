// NamedTensors: tensors looked up by name, in the order they were set. A
// micro-batch's tensors beyond its inputs and targets (a second input, a
// second target, a mask), a model's several inputs and outputs and their
// gradients (Module::forward_named), and a loss of several terms read them.
// A missing name throws InvalidArgument naming the names there are.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/error.h"

namespace lockstep::core {

class NamedTensors {
 public:
  using Entry = std::pair<std::string, Tensor>;

  NamedTensors() = default;
  NamedTensors(std::initializer_list<Entry> entries) {
    for (const Entry& e : entries) set(e.first, e.second);
  }

  // Replaces the tensor named `name`, or appends it.
  void set(const std::string& name, Tensor value) {
    for (Entry& e : entries_)
      if (e.first == name) {
        e.second = std::move(value);
        return;
      }
    entries_.emplace_back(name, std::move(value));
  }
  // Null when there is none.
  const Tensor* find(std::string_view name) const {
    for (const Entry& e : entries_)
      if (e.first == name) return &e.second;
    return nullptr;
  }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // Throws InvalidArgument naming `who` (the reader: "MSELoss term 2") and
  // the names there are.
  const Tensor& at(std::string_view name, std::string_view who) const {
    if (const Tensor* t = find(name)) return *t;
    std::string names;
    for (const Entry& e : entries_) names += (names.empty() ? "'" : ", '") + e.first + "'";
    throw InvalidArgument(std::string(who) + ": no tensor named '" + std::string(name) +
                          "'; there are " + (names.empty() ? "none" : names) +
                          " (check the names the model, the batch and the loss use)");
  }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace lockstep::core
