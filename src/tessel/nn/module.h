// Modules: a tree of named parts holding parameters. A parameter is declared with its global
// shape and an init rule and materialised later, so a model can be described without
// allocating it and each rank can create only its own pieces. Full names are hierarchical
// (transformer.h.0.attn.c_attn.weight) and are also the RNG streams of initialisation: a
// parameter's value depends on the seed and its name alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/philox.h"
#include "tessel/core/tensor.h"

namespace tessel::nn {

// How a parameter's initial value is drawn (at each element's global index).
struct Init {
  enum class Kind { zeros, ones, normal, uniform } kind = Kind::zeros;
  double a = 0, b = 0;  // normal: mean a, std b; uniform: [a, b)
  static Init zeros() { return {Kind::zeros}; }
  static Init ones() { return {Kind::ones}; }
  static Init normal(double std, double mean = 0) { return {Kind::normal, mean, std}; }
  static Init uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
};

// Fills `local` — the block of a parameter of `global_shape` at `offset` (empty: all of it) —
// with its initial values.
void init_fill(const Tensor& local, const Init& init, uint64_t seed, const std::string& name, const GlobalBox& box = {});

struct Parameter {
  std::string name;  // full name, set when the owning tree is finalised
  Shape shape;       // global shape
  // The shape a checkpoint file gives it (Hugging Face's), when that differs from `shape`:
  // the same row-major bytes, so a tensor of one views as the other (GPT-2's c_attn is
  // [C, 3, C] here, so tensor parallelism can shard it by heads, and [C, 3C] in the file).
  Shape file_shape;
  // Set when the files hold one tensor per index of dim 0 instead (a mixture of experts' stacked
  // matrices, "….experts.w1.weight" [E, F, C] here and E tensors "….experts.<e>.w1.weight" [F, C]
  // in Hugging Face's files): see stacked_file_name.
  bool file_stack = false;
  DType dtype = DType::f32;
  Init init;
  Tensor value;  // this rank's tensor; undefined until materialised
  // Set by parallel layouts that store the parameter sharded (ZeRO stage 3): turns `value`
  // into the tensor a forward uses (gathered), just before the use.
  std::function<Tensor(const Tensor&)> gather;

  // The tensor a forward computes with: `value`, or its gathered form.
  Tensor use() const { return gather ? gather(value) : value; }
  // The shape it has in a checkpoint file.
  const Shape& stored_shape() const { return file_shape.empty() ? shape : file_shape; }
};

// The name a checkpoint file gives index `i` of a stacked parameter: `i` put in before its
// module's name ("a.experts.w1.weight" -> "a.experts.3.w1.weight").
std::string stacked_file_name(const std::string& name, int64_t i);

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of the tree, depth first in registration order.
  std::vector<Parameter*> parameters();
  std::vector<const Parameter*> parameters() const;
  // The parameter with full name `name`; throws listing a few names when absent.
  Parameter& parameter(const std::string& name);
  // This module and every module below it, depth first.
  std::vector<Module*> modules();
  // The parameters this module holds itself (not its children's).
  std::vector<Parameter*> own_parameters();
  // Full name of this module ("" for the root).
  const std::string& path() const { return path_; }
  // Sets the full names of every module and parameter below, rooted at `prefix`.
  void finalize_names(const std::string& prefix = "");

  // Layout hooks set by parallelize (PrepareInput/PrepareOutput): applied by modules that
  // honour them (Linear, Embedding) to the input before and the output after their forward.
  std::function<Tensor(const Tensor&)> input_hook, output_hook;
  Tensor prepare_input(const Tensor& x) const { return input_hook ? input_hook(x) : x; }
  Tensor prepare_output(const Tensor& y) const { return output_hook ? output_hook(y) : y; }

  void train(bool on = true);
  bool training() const { return training_; }

  // Allocates and initialises every parameter on this rank from `seed` (the single-rank path;
  // distributed layouts create their own local pieces instead), in `dtype` when given (f64 for
  // gradient checks) or each parameter's own dtype.
  void materialize(uint64_t seed, std::optional<DType> dtype = std::nullopt);
  // Number of parameter elements (global).
  int64_t num_parameters() const;

 protected:
  Parameter& add_parameter(std::string name, Shape shape, Init init, DType dtype = DType::f32);
  // A parameter whose checkpoint files hold it as `file_shape` (same elements, same order).
  Parameter& add_parameter(std::string name, Shape shape, Shape file_shape, Init init);
  template <typename M>
  M& add_module(std::string name, std::unique_ptr<M> m) {
    M& ref = *m;
    children_.emplace_back(std::move(name), std::move(m));
    return ref;
  }

 private:
  std::string path_;
  bool training_ = true;
  std::vector<std::pair<std::string, std::unique_ptr<Parameter>>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// A module that only groups children under a name ("transformer", "model", "experts").
class ModuleGroup : public Module {
 public:
  template <typename M>
  M& add(std::string name, std::unique_ptr<M> m) {
    return add_module(std::move(name), std::move(m));
  }
};

// Evaluation mode (no dropout) for the guard's lifetime; training mode again afterwards, also
// when an exception leaves the scope.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(Module& m) : m_(m) { m_.train(false); }
  ~EvalModeGuard() { m_.train(true); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  Module& m_;
};

// A numbered list of modules ("h.0", "h.1", ...).
template <typename M>
class ModuleList : public Module {
 public:
  M& append(std::unique_ptr<M> m) {
    M& ref = add_module(std::to_string(items_.size()), std::move(m));
    items_.push_back(&ref);
    return ref;
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_[i]; }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<M*> items_;
};

}  // namespace tessel::nn
