// Tensor: a strided view of a Storage with a dtype, plus the autograd slots the op layer
// records into. A Tensor is a cheap handle; copies share the same TensorImpl. Differentiable
// operations live in the ops layer; core offers only raw, non-recording views (view.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"
#include "tessel/core/error.h"
#include "tessel/core/shape.h"
#include "tessel/core/storage.h"

namespace tessel {

class GradNode;
struct AutogradMeta;
struct DistSpec;

// Shape, dtype and device: what an op's shape inference reasons about.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string str() const;  // "f32[2, 3]"
  bool operator==(const TensorMeta&) const = default;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;
  std::shared_ptr<const DistSpec> dist;  // set by the dist layer for distributed tensors
  std::string name;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (new contiguous storage) ----
  // Without a device, a factory makes its tensor on the rank's current device (DeviceScope);
  // the ones that take host values write them on the host and copy them there.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, std::optional<Device> device = std::nullopt);
  static Tensor empty(const TensorMeta& meta) { return empty(meta.shape, meta.dtype, meta.device); }
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, std::optional<Device> device = std::nullopt);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, std::optional<Device> device = std::nullopt);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     std::optional<Device> device = std::nullopt);
  static Tensor scalar(double value, DType dtype = DType::f32);
  static Tensor arange(int64_t n, DType dtype = DType::i64);
  // Copies `values` (converted to `dtype`) into a new tensor of `shape`.
  static Tensor from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  // A tensor of `shape` and `dtype` viewing host memory the caller keeps alive (no copy).
  static Tensor borrow_host(const void* data, const Shape& shape, DType dtype);
  // A view of existing storage.
  static Tensor from_storage(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
                             const Shape& strides, DType dtype);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  const Shape& strides() const { return impl().strides; }
  int64_t stride(int64_t d) const;
  int64_t offset() const { return impl().offset; }
  int64_t numel() const { return shape_numel(impl().shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(impl().dtype); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage ? impl().storage->device() : Device{}; }
  TensorMeta meta() const { return TensorMeta{shape(), dtype(), device()}; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  // This tensor on `device`: itself when already there, else a contiguous copy (to and from
  // a GPU through pinned staging). Records no autograd history (the `to` op does).
  Tensor to(Device device) const;
  // Made while tracing (meta mode): a shape with no data behind it.
  bool is_meta() const { return impl().storage != nullptr && impl().storage->meta(); }

  // A contiguous copy on the rank's current device (no autograd history).
  Tensor to_new_storage() const;

  // ---- data ----
  // Pointer to the first element; checks that T matches the dtype.
  template <typename T>
  T* data() const {
    TESSEL_CHECK(dtype_of<T> == dtype(), "tensor '{}': data<{}>() on a {} tensor", name(), dtype_of<T>, dtype());
    TESSEL_CHECK(!is_meta(), "tensor {} was made while tracing (meta mode): it has a shape but no data", str());
    return static_cast<T*>(raw_data());
  }
  // Null for a tensor made in meta mode (data<T>() throws for one).
  void* raw_data() const;
  // The single element, converted to double.
  double item() const;
  // Every element in row-major order, converted to double (for tests and printing). These
  // copy from the tensor's device; the host waits for it.
  std::vector<double> to_doubles() const;
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- autograd slots (the ops layer records, the autograd layer runs) ----
  bool requires_grad() const;
  // Marks a leaf as requiring a gradient; only floating tensors can.
  const Tensor& set_requires_grad(bool value = true) const;
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<GradNode>& grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  AutogradMeta& autograd_meta() const;  // created on first use
  // Same data, no autograd history.
  Tensor detach() const;

  // ---- identity ----
  const std::string& name() const;
  const Tensor& set_name(std::string name) const;
  TensorImpl* impl_ptr() const { return impl_.get(); }
  // How many Tensor handles share this one's impl (1: nobody else can observe it).
  long impl_use_count() const { return impl_.use_count(); }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  long use_count() const { return impl_.use_count(); }
  // "f32[2, 3]" or "'name' f32[2, 3]"; with values when `values` is set (up to a limit).
  std::string str(bool values = false) const;

 private:
  TensorImpl& impl() const {
    TESSEL_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// Autograd state of a tensor. Leaves accumulate into `grad`; outputs of recorded ops point
// at the GradNode that made them.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<GradNode> grad_fn;
  int output_nr = 0;
  // Run after each gradient accumulated into this leaf.
  std::vector<std::function<void(const Tensor& grad)>> post_accumulate_hooks;
  // Run once per backward, when this leaf has received every gradient that backward gives it
  // (all its uses' contributions; with a split backward, after backward_weights). Data
  // parallelism reduces gradient buckets from here while the backward goes on.
  std::vector<std::function<void(const Tensor& grad)>> grad_ready_hooks;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  TESSEL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
               "from_vector: {} values for shape {} ({} elements)", values.size(), shape_str(shape),
               shape_numel(shape));
  return borrow_host(values.data(), shape, dtype_of<T>).to_new_storage();
}

}  // namespace tessel

template <>
struct fmt::formatter<tessel::TensorMeta> : fmt::formatter<std::string_view> {
  auto format(const tessel::TensorMeta& m, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(m.str(), ctx);
  }
};
