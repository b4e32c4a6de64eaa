// Tensor factories, metadata, element access and autograd slots.
#include "tessel/core/tensor.h"

#include <algorithm>

#include "tessel/core/context.h"
#include "tessel/core/convert.h"
#include "tessel/core/grad_node.h"
#include "tessel/core/view.h"

namespace tessel {

std::string TensorMeta::str() const { return fmt::format("{}{}", dtype, shape_str(shape)); }

Tensor Tensor::empty(const Shape& shape, DType dtype, std::optional<Device> device) {
  // The bytes, and the span of the strides (zero dims counted as 1), must not overflow.
  int64_t span = static_cast<int64_t>(dtype_size(dtype)), nbytes = span;
  for (int64_t s : shape) {
    TESSEL_CHECK(s >= 0, "empty: negative size in shape {}", shape_str(shape));
    TESSEL_CHECK(!__builtin_mul_overflow(span, std::max<int64_t>(s, 1), &span) &&
                     !__builtin_mul_overflow(nbytes, s, &nbytes),
                 "empty: shape {} of {} is too large to address", shape_str(shape), dtype_name(dtype));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(static_cast<size_t>(nbytes), device.value_or(current_device()));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, std::optional<Device> device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, std::optional<Device> device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, std::optional<Device> device) {
  Tensor t = empty(shape, dtype, device);
  if (!t.storage()->meta()) view::fill(t, value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor Tensor::arange(int64_t n, DType dtype) {
  TESSEL_CHECK(n >= 0, "arange: negative length {}", n);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i);
  return from_doubles(values, {n}, dtype);
}

Tensor Tensor::from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype) {
  TESSEL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
               "from_doubles: {} values for shape {} ({} elements)", values.size(), shape_str(shape),
               shape_numel(shape));
  Tensor t = empty(shape, dtype);
  view::copy(t, borrow_host(values.data(), shape, DType::f64));
  return t;
}

Tensor Tensor::borrow_host(const void* data, const Shape& shape, DType dtype) {
  size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return from_storage(Storage::wrap(const_cast<void*>(data), nbytes, Device{}, [] {}), 0, shape,
                      contiguous_strides(shape), dtype);
}

Tensor Tensor::to_new_storage() const {
  Tensor t = empty(shape(), dtype());
  view::copy(t, *this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (this->device() == device) return *this;
  Tensor t = empty(shape(), dtype(), device);
  view::copy(t, *this);
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
                            const Shape& strides, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[normalize_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  const TensorImpl& i = impl();
  int64_t expected = 1;
  for (size_t d = i.shape.size(); d-- > 0;) {
    if (i.shape[d] == 1) continue;
    if (i.strides[d] != expected) return i.shape[d] == 0 || shape_numel(i.shape) == 0;
    expected *= i.shape[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  const TensorImpl& i = impl();
  TESSEL_CHECK(i.dist == nullptr,
               "tensor {} is distributed: its data live in per-rank pieces (use to_local() or full_tensor())", str());
  if (!i.storage) return nullptr;
  if (i.storage->meta()) return nullptr;  // traced: buffers handed to a recording comm backend
  return static_cast<char*>(i.storage->data()) + i.offset * static_cast<int64_t>(dtype_size(i.dtype));
}

double Tensor::item() const {
  TESSEL_CHECK(numel() == 1, "item(): tensor {} has {} elements, not 1", str(), numel());
  return to_doubles()[0];
}

std::vector<double> Tensor::to_doubles() const { return to_vector<double>(); }

template <typename T>
std::vector<T> Tensor::to_vector() const {
  std::vector<T> out(static_cast<size_t>(numel()));
  if (out.empty()) return out;
  view::copy(borrow_host(out.data(), shape(), dtype_of<T>), *this);
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

bool Tensor::requires_grad() const {
  const TensorImpl& i = impl();
  return i.autograd != nullptr && (i.autograd->requires_grad || i.autograd->grad_fn != nullptr);
}

const Tensor& Tensor::set_requires_grad(bool value) const {
  TESSEL_CHECK(!value || is_floating(dtype()), "set_requires_grad: tensor '{}' has dtype {}; only floating tensors can require gradients", name(), dtype());
  TESSEL_CHECK(is_leaf(), "set_requires_grad: tensor '{}' is the output of {} and not a leaf; detach() it first", name(),
               "an op");
  autograd_meta().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  const TensorImpl& i = impl();
  return i.autograd ? i.autograd->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined())
    TESSEL_CHECK(grad.shape() == shape(), "set_grad: gradient shape {} does not match tensor '{}' shape {}",
                 shape_str(grad.shape()), name(), shape_str(shape()));
  autograd_meta().grad = grad;
}

const std::shared_ptr<GradNode>& Tensor::grad_fn() const {
  static const std::shared_ptr<GradNode> kNone;
  const TensorImpl& i = impl();
  return i.autograd ? i.autograd->grad_fn : kNone;
}

AutogradMeta& Tensor::autograd_meta() const {
  TensorImpl& i = impl();
  if (!i.autograd) i.autograd = std::make_shared<AutogradMeta>();
  return *i.autograd;
}

Tensor Tensor::detach() const {
  const TensorImpl& i = impl();
  auto d = std::make_shared<TensorImpl>();
  d->storage = i.storage;
  d->offset = i.offset;
  d->shape = i.shape;
  d->strides = i.strides;
  d->dtype = i.dtype;
  d->dist = i.dist;
  d->name = i.name;
  return Tensor(std::move(d));
}

const std::string& Tensor::name() const {
  static const std::string kEmpty;
  return impl_ ? impl_->name : kEmpty;
}

const Tensor& Tensor::set_name(std::string name) const {
  impl().name = std::move(name);
  return *this;
}

std::string Tensor::str(bool values) const {
  if (!defined()) return "Tensor(undefined)";
  std::string head = name().empty() ? meta().str() : fmt::format("'{}' {}", name(), meta().str());
  if (!values) return head;
  constexpr int64_t kMax = 64;
  std::vector<double> v = to_doubles();
  if (static_cast<int64_t>(v.size()) > kMax) v.resize(kMax);
  return fmt::format("{} {{{}{}}}", head, fmt::join(v, ", "), numel() > kMax ? ", ..." : "");
}

// ---- GradNode helpers (grad_node.h) ----

GradEdge gradient_edge(const Tensor& t) {
  if (!t.defined() || t.impl_ptr()->autograd == nullptr) return {};
  const std::shared_ptr<AutogradMeta>& m = t.impl_ptr()->autograd;
  if (m->grad_fn) return GradEdge{m->grad_fn, m->output_nr, nullptr};
  if (m->requires_grad) return GradEdge{nullptr, 0, m};
  return {};
}

void set_history(const std::vector<Tensor>& outputs, const std::shared_ptr<GradNode>& node) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    AutogradMeta& m = outputs[i].autograd_meta();
    m.grad_fn = node;
    m.output_nr = static_cast<int>(i);
  }
}

uint64_t next_sequence_nr() { return rank_context().next_seq_nr++; }

}  // namespace tessel
