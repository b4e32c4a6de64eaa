// Module tree, naming and materialisation.
#include "tessel/nn/module.h"

#include "tessel/core/error.h"
#include "tessel/core/view.h"

namespace tessel::nn {

void init_fill(const Tensor& local, const Init& init, uint64_t seed, const std::string& name, const GlobalBox& box) {
  switch (init.kind) {
    case Init::Kind::zeros: view::fill(local, 0.0); return;
    case Init::Kind::ones: view::fill(local, 1.0); return;
    case Init::Kind::normal:
      rng_fill(local, Distribution::normal, init.a, init.b, seed, stream_key(name), box);
      return;
    case Init::Kind::uniform:
      rng_fill(local, Distribution::uniform, init.a, init.b, seed, stream_key(name), box);
      return;
  }
}

Parameter& Module::add_parameter(std::string name, Shape shape, Init init, DType dtype) {
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->shape = std::move(shape);
  p->dtype = dtype;
  p->init = init;
  Parameter& ref = *p;
  params_.emplace_back(std::move(name), std::move(p));
  return ref;
}

Parameter& Module::add_parameter(std::string name, Shape shape, Shape file_shape, Init init) {
  TESSEL_ASSERT(shape_numel(shape) == shape_numel(file_shape), "parameter '{}': shape {} and file shape {} differ in size",
                name, shape_str(shape), shape_str(file_shape));
  Parameter& p = add_parameter(std::move(name), std::move(shape), init);
  if (file_shape != p.shape) p.file_shape = std::move(file_shape);
  return p;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& [n, p] : params_) out.push_back(p.get());
  for (auto& [n, c] : children_)
    for (Parameter* p : c->parameters()) out.push_back(p);
  return out;
}

std::vector<const Parameter*> Module::parameters() const {
  std::vector<const Parameter*> out;
  for (const auto& [n, p] : params_) out.push_back(p.get());
  for (const auto& [n, c] : children_)
    for (const Parameter* p : static_cast<const Module&>(*c).parameters()) out.push_back(p);
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out{this};
  for (auto& [n, c] : children_)
    for (Module* m : c->modules()) out.push_back(m);
  return out;
}

std::vector<Parameter*> Module::own_parameters() {
  std::vector<Parameter*> out;
  for (auto& [n, p] : params_) out.push_back(p.get());
  return out;
}

Parameter& Module::parameter(const std::string& name) {
  std::vector<Parameter*> all = parameters();
  for (Parameter* p : all)
    if (p->name == name) return *p;
  std::string some;
  for (size_t i = 0; i < all.size() && i < 6; ++i) some += (i ? ", " : "") + all[i]->name;
  TESSEL_THROW("model has no parameter '{}' ({} parameters, e.g. {})", name, all.size(), some);
}

std::string stacked_file_name(const std::string& name, int64_t i) {
  const size_t last = name.rfind('.');
  const size_t before = last == std::string::npos || last == 0 ? std::string::npos : name.rfind('.', last - 1);
  const size_t at = before == std::string::npos ? 0 : before + 1;
  return name.substr(0, at) + std::to_string(i) + "." + name.substr(at);
}

void Module::finalize_names(const std::string& prefix) {
  path_ = prefix;
  for (auto& [n, p] : params_) p->name = prefix.empty() ? n : prefix + "." + n;
  for (auto& [n, c] : children_) c->finalize_names(prefix.empty() ? n : prefix + "." + n);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::materialize(uint64_t seed, std::optional<DType> dtype) {
  for (Parameter* p : parameters()) {
    if (dtype) p->dtype = *dtype;
    Tensor t = Tensor::empty(p->shape, p->dtype);
    init_fill(t, p->init, seed, p->name);
    t.set_name(p->name);
    t.set_requires_grad(true);
    p->value = t;
  }
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Parameter* p : parameters()) n += shape_numel(p->shape);
  return n;
}

}  // namespace tessel::nn
