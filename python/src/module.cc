// tessel._C: the Python bindings of the C++ core. Thin: every call goes to the core's own
// functions (the registry's ops through call_op, autograd's backward, the Philox fills); this
// file converts arguments and results and maps errors to Python exceptions. Tensor memory is
// shared with NumPy both ways where the layout allows (a contiguous CPU tensor is a NumPy
// array without a copy; from_numpy wraps a C-contiguous array's buffer), and the GIL is
// released inside every op and backward.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/philox.h"
#include "tessel/core/tensor.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/matmul.h"
#include "tessel/ops/registry.h"
#include "tessel/ops/shape.h"

namespace py = pybind11;
using namespace tessel;

namespace {

// A tensor made while tracing or a distributed one: no host memory of its own to share.
bool is_dist_or_meta(const Tensor& t) { return t.is_meta() || t.impl_ptr()->dist != nullptr; }

// ---------------------------------------------------------------- dtypes
// NumPy's names for the dtypes it has; bf16 has none (numpy() widens it to float32).
std::optional<DType> dtype_from_numpy(const py::dtype& d) {
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'b' && size == 1) return DType::b8;
  return std::nullopt;
}

py::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::f32: return py::dtype::of<float>();
    case DType::f64: return py::dtype::of<double>();
    case DType::i32: return py::dtype::of<int32_t>();
    case DType::i64: return py::dtype::of<int64_t>();
    case DType::b8: return py::dtype::of<bool>();
    case DType::bf16: break;
  }
  throw py::type_error("bf16 has no NumPy dtype: cast the tensor to float32 first (t.astype('float32'))");
}

DType parse_dtype_arg(const py::handle& h) {
  if (py::isinstance<DType>(h)) return h.cast<DType>();
  if (py::isinstance<py::str>(h)) {
    const std::string s = h.cast<std::string>();
    for (DType d : kAllDTypes)
      if (dtype_name(d) == s) return d;
    if (s == "float32" || s == "float") return DType::f32;
    if (s == "float64" || s == "double") return DType::f64;
    if (s == "bfloat16") return DType::bf16;
    if (s == "int32") return DType::i32;
    if (s == "int64" || s == "int") return DType::i64;
    if (s == "bool") return DType::b8;
    throw py::value_error("unknown dtype '" + s + "' (float32, float64, bfloat16, int32, int64, bool)");
  }
  if (auto d = dtype_from_numpy(py::dtype::from_args(py::reinterpret_borrow<py::object>(h)))) return *d;
  throw py::type_error("cannot read a tessel dtype from " + std::string(py::str(py::type::of(h))));
}

// ---------------------------------------------------------------- NumPy interop
// A tensor's memory as a NumPy array, sharing it: `owner` (the Python Tensor) keeps it alive.
py::array as_numpy(const Tensor& t, py::handle owner) {
  TESSEL_CHECK(!is_dist_or_meta(t), "tensor {} has no host memory to share with NumPy", t.str());
  if (t.dtype() == DType::bf16) {
    Tensor wide;
    {
      py::gil_scoped_release release;
      wide = cast(t.detach(), DType::f32);
    }
    return as_numpy(wide, py::cast(wide));
  }
  TESSEL_CHECK(t.device().type == DeviceType::cpu,
               "tensor {} lives on {}: copy it to the host first (t.cpu())", t.str(), t.device().str());
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
  const auto item = static_cast<py::ssize_t>(dtype_size(t.dtype()));
  for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s) * item);
  return py::array(numpy_dtype(t.dtype()), shape, strides, t.raw_data(), owner);
}

// A C-contiguous array's buffer as a tensor without a copy; the tensor holds the array.
Tensor from_numpy(const py::array& a) {
  const std::optional<DType> dt = dtype_from_numpy(a.dtype());
  if (!dt) throw py::type_error("from_numpy: NumPy dtype " + std::string(py::str(a.dtype())) +
                                " has no tessel dtype (float32, float64, int32, int64, bool)");
  if (!(a.flags() & py::array::c_style))
    throw py::value_error("from_numpy: the array is not C-contiguous; np.ascontiguousarray() it, or use to_tensor (a copy)");
  Shape shape(a.shape(), a.shape() + a.ndim());
  auto* keep = new py::object(a);  // released with the storage, under the GIL
  auto storage = Storage::wrap(const_cast<void*>(a.data()), static_cast<size_t>(a.nbytes()), Device{}, [keep] {
    py::gil_scoped_acquire gil;
    delete keep;
  });
  return Tensor::from_storage(std::move(storage), 0, shape, contiguous_strides(shape), *dt);
}

// Anything NumPy reads (a list, a scalar, an array) copied into a new tensor.
Tensor to_tensor(const py::object& data, const py::object& dtype, bool stop_gradient) {
  if (py::isinstance<Tensor>(data)) {
    Tensor src = data.cast<Tensor>();
    Tensor t = dtype.is_none() ? src.detach().to_new_storage() : cast(src.detach(), parse_dtype_arg(dtype));
    if (!stop_gradient) t.set_requires_grad(true);
    return t;
  }
  py::array a = py::array::ensure(data, py::array::c_style | py::array::forcecast);
  if (!a) throw py::type_error("to_tensor: cannot read " + std::string(py::str(py::type::of(data))) + " as an array");
  std::optional<DType> dt = dtype_from_numpy(a.dtype());
  if (a.dtype().kind() == 'f' && a.dtype().itemsize() == 8 && dtype.is_none() &&
      !py::isinstance<py::array>(data))
    dt = DType::f32;  // Python floats make float32 tensors, as in the system tessel is modelled on
  if (a.dtype().kind() == 'i' && dtype.is_none() && !py::isinstance<py::array>(data)) dt = DType::i64;
  if (!dt) throw py::type_error("to_tensor: NumPy dtype " + std::string(py::str(a.dtype())) + " has no tessel dtype");
  Shape shape(a.shape(), a.shape() + a.ndim());
  Tensor host = Tensor::empty(shape, *dt);
  if (dtype_from_numpy(a.dtype()) == *dt) {
    std::memcpy(host.raw_data(), a.data(), static_cast<size_t>(a.nbytes()));
  } else {
    py::array conv = py::array::ensure(a.attr("astype")(numpy_dtype(*dt)), py::array::c_style);
    std::memcpy(host.raw_data(), conv.data(), static_cast<size_t>(conv.nbytes()));
  }
  Tensor t = dtype.is_none() ? host : cast(host, parse_dtype_arg(dtype));
  if (!stop_gradient) t.set_requires_grad(true);
  return t;
}

// ---------------------------------------------------------------- attributes
AttrValue attr_value(const std::string& key, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<DType>(v)) return v.cast<DType>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::vector<int64_t> xs;
    for (const py::handle& x : v) {
      if (!py::isinstance<py::int_>(x) || py::isinstance<py::bool_>(x))
        throw py::type_error("attribute '" + key + "': a list must hold ints, got " + std::string(py::str(v)));
      xs.push_back(x.cast<int64_t>());
    }
    return xs;
  }
  throw py::type_error("attribute '" + key + "': cannot pass " + std::string(py::str(py::type::of(v))) +
                       " (bool, int, float, str, dtype or a list of ints)");
}

// Keywords as the op's attributes, converted to the types its signature gives (a dtype from
// its name or a NumPy dtype, a float from an int); undeclared keys pass as they are.
Attrs attrs_of(const OpDef& op, const py::dict& kwargs) {
  const std::vector<AttrSpec>& specs = op_attr_specs(op);
  Attrs a;
  for (const auto& [k, v] : kwargs) {
    const std::string key = py::str(k);
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const AttrSpec& s) { return s.name == key; });
    if (spec != specs.end() && spec->type == "dtype" && !py::isinstance<DType>(v)) {
      a.set(key, parse_dtype_arg(v));
    } else if (spec != specs.end() && spec->type == "float" && py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
      a.set(key, v.cast<double>());
    } else {
      a.set(key, attr_value(key, v));
    }
  }
  return a;
}

// ---------------------------------------------------------------- op calls
Tensor as_tensor_arg(const py::handle& h, const Tensor* like) {
  if (h.is_none()) return Tensor();
  if (py::isinstance<Tensor>(h)) return h.cast<Tensor>();
  if (like != nullptr && (py::isinstance<py::float_>(h) || py::isinstance<py::int_>(h)))
    return Tensor::scalar(h.cast<double>(), like->dtype());
  return to_tensor(py::reinterpret_borrow<py::object>(h), py::none(), true);
}

py::object call_registry_op(const std::string& name, const py::args& args, const py::kwargs& kwargs) {
  const OpDef& op = op_by_name(name);
  std::vector<Tensor> inputs;
  const Tensor* first = nullptr;
  for (const py::handle& h : args) {
    inputs.push_back(as_tensor_arg(h, first));
    if (first == nullptr && inputs.back().defined()) first = &inputs.back();
  }
  const Attrs attrs = attrs_of(op, kwargs);
  std::vector<Tensor> outs;
  {
    py::gil_scoped_release release;
    outs = call_op(op, std::move(inputs), attrs);
  }
  if (outs.size() == 1) return py::cast(outs[0]);
  return py::cast(outs);
}

// Python scalars on either side of an operator: a scale (alpha * x + beta), else the op.
Tensor binary(const Tensor& a, const py::object& b, char op, bool reflected) {
  if (py::isinstance<py::float_>(b) || (py::isinstance<py::int_>(b) && !py::isinstance<py::bool_>(b))) {
    const double c = b.cast<double>();
    py::gil_scoped_release release;
    switch (op) {
      case '+': return scale(a, 1.0, c);
      case '-': return reflected ? scale(a, -1.0, c) : scale(a, 1.0, -c);
      case '*': return scale(a, c);
      case '/':
        if (!reflected) return scale(a, 1.0 / c);
        return div(Tensor::full(a.shape(), c, a.dtype()), a);
    }
  }
  const Tensor t = as_tensor_arg(b, &a);
  const Tensor& x = reflected ? t : a;
  const Tensor& y = reflected ? a : t;
  py::gil_scoped_release release;
  switch (op) {
    case '+': return add(x, y);
    case '-': return sub(x, y);
    case '*': return mul(x, y);
    case '/': return div(x, y);
    case '@': return matmul(x, y);
  }
  throw py::value_error(std::string("unknown operator ") + op);
}

int64_t wrap_index(int64_t i, int64_t n, int64_t dim) {
  const int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    throw py::index_error("index " + std::to_string(i) + " is out of range for dim " + std::to_string(dim) +
                          " of size " + std::to_string(n));
  return j;
}

// t[i], t[a:b:s] and tuples of them, as the registry's slice and squeeze views.
Tensor get_item(const Tensor& t, const py::object& key) {
  std::vector<py::object> parts;
  if (py::isinstance<py::tuple>(key))
    for (const py::handle& h : key) parts.push_back(py::reinterpret_borrow<py::object>(h));
  else parts.push_back(key);
  if (static_cast<int64_t>(parts.size()) > t.dim())
    throw py::index_error("too many indices (" + std::to_string(parts.size()) + ") for a tensor of " +
                          std::to_string(t.dim()) + " dims");
  Tensor out = t;
  int64_t dim = 0;
  std::vector<int64_t> dropped;
  for (const py::object& p : parts) {
    const int64_t n = out.size(dim);
    if (py::isinstance<py::int_>(p) && !py::isinstance<py::bool_>(p)) {
      const int64_t i = wrap_index(p.cast<int64_t>(), n, dim);
      py::gil_scoped_release release;
      out = slice(out, dim, i, i + 1);
      dropped.push_back(dim);
    } else if (py::isinstance<py::slice>(p)) {
      py::ssize_t start = 0, stop = 0, step = 0, len = 0;
      if (!py::reinterpret_borrow<py::slice>(p).compute(static_cast<py::ssize_t>(n), &start, &stop, &step, &len))
        throw py::error_already_set();
      if (step <= 0) throw py::value_error("a slice's step must be positive");
      py::gil_scoped_release release;
      out = slice(out, dim, start, start + len * step, step);
    } else {
      throw py::type_error("tensor index: only ints and slices (and tuples of them) are supported, got " +
                           std::string(py::str(py::type::of(p))));
    }
    ++dim;
  }
  py::gil_scoped_release release;
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) out = squeeze(out, *it);
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tessel's C++ core (tensors, the op registry, autograd); use the `tessel` package";

  // Errors: the core's kinds as Python exceptions; the message is the C++ one.
  auto base = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<InternalError>(m, "InternalError", base.ptr());
  auto input = py::register_exception<InputError>(m, "InputError", PyExc_ValueError);
  py::register_exception<CheckpointError>(m, "CheckpointError", input.ptr());
  auto comm = py::register_exception<CommError>(m, "CommError", base.ptr());
  py::register_exception<TimeoutError>(m, "CommTimeoutError", comm.ptr());

  py::enum_<DType>(m, "dtype", "a tensor's element type")
      .value("float32", DType::f32)
      .value("float64", DType::f64)
      .value("bfloat16", DType::bf16)
      .value("int32", DType::i32)
      .value("int64", DType::i64)
      .value("bool", DType::b8)
      .def_property_readonly("itemsize", [](DType d) { return dtype_size(d); });

  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), "an n-dimensional array with autograd (C++ tessel::Tensor)")
      .def_buffer([](Tensor& t) -> py::buffer_info {
        TESSEL_CHECK(t.device().type == DeviceType::cpu && t.dtype() != DType::bf16 && !is_dist_or_meta(t),
                     "tensor {} cannot expose a buffer (bf16, a device tensor or a distributed one): use numpy()",
                     t.str());
        std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
        const auto item = static_cast<py::ssize_t>(dtype_size(t.dtype()));
        for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s) * item);
        const std::string format = py::str(numpy_dtype(t.dtype()).attr("char"));
        return py::buffer_info(t.raw_data(), item, format, t.dim(), shape, strides);
      })
      .def_property_readonly("shape", [](const Tensor& t) { return std::vector<int64_t>(t.shape()); })
      .def_property_readonly("ndim", &Tensor::dim)
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("place", [](const Tensor& t) { return t.device().str(); }, "the device, as text ('cpu')")
      .def("numel", &Tensor::numel)
      .def("dim", &Tensor::dim)
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) throw py::type_error("len() of a 0-dim tensor");
        return t.size(0);
      })
      .def("numpy", [](py::object self) { return as_numpy(self.cast<Tensor>(), self); },
           "the values as a NumPy array sharing this tensor's memory (bf16: a float32 copy)")
      .def("__array__", [](py::object self, py::object dtype) {
             py::array a = as_numpy(self.cast<Tensor>(), self);
             return dtype.is_none() ? a : py::array(a.attr("astype")(dtype));
           }, py::arg("dtype") = py::none())
      .def("item", [](const Tensor& t) { return t.dtype() == DType::b8 ? py::object(py::bool_(t.item() != 0))
                                              : is_floating(t.dtype()) ? py::object(py::float_(t.item()))
                                                                       : py::object(py::int_(static_cast<int64_t>(t.item()))); })
      .def("tolist", [](py::object self) { return as_numpy(self.cast<Tensor>(), self).attr("tolist")(); })
      .def("astype", [](const Tensor& t, const py::object& d) {
             const DType to = parse_dtype_arg(d);
             py::gil_scoped_release release;
             return cast(t, to);
           }, "a copy of another dtype (differentiable between floating dtypes)")
      .def("contiguous", [](const Tensor& t) { py::gil_scoped_release r; return contiguous(t); })
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("detach", &Tensor::detach, "the same values, with no autograd history")
      .def_property("stop_gradient", [](const Tensor& t) { return !t.requires_grad(); },
                    [](const Tensor& t, bool stop) { t.set_requires_grad(!stop); },
                    "True when no gradient is computed for this tensor (the inverse of requires_grad)")
      .def_property("requires_grad", [](const Tensor& t) { return t.requires_grad(); },
                    [](const Tensor& t, bool v) { t.set_requires_grad(v); })
      .def("requires_grad_", [](const Tensor& t, bool v) { t.set_requires_grad(v); return t; }, py::arg("requires_grad") = true)
      .def_property_readonly("grad", [](const Tensor& t) -> py::object {
        Tensor g = t.grad();
        return g.defined() ? py::cast(g) : py::none();
      })
      .def("clear_grad", [](const Tensor& t) { t.set_grad(Tensor()); }, "drops the accumulated gradient")
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property("name", [](const Tensor& t) { return t.name(); }, [](const Tensor& t, std::string n) { t.set_name(std::move(n)); })
      .def("backward", [](const Tensor& t, const py::object& grad, bool retain_graph) {
             Tensor g = grad.is_none() ? Tensor() : as_tensor_arg(grad, &t);
             py::gil_scoped_release release;
             backward(t, g, retain_graph);
           }, py::arg("grad_tensor") = py::none(), py::arg("retain_graph") = false,
           "accumulates d(this)/d(leaf) into every leaf's .grad (a non-scalar needs grad_tensor)")
      .def("__repr__", [](const Tensor& t) { return "tessel." + t.str(true); })
      .def("__getitem__", &get_item)
      .def("__add__", [](const Tensor& a, py::object b) { return binary(a, b, '+', false); })
      .def("__radd__", [](const Tensor& a, py::object b) { return binary(a, b, '+', true); })
      .def("__sub__", [](const Tensor& a, py::object b) { return binary(a, b, '-', false); })
      .def("__rsub__", [](const Tensor& a, py::object b) { return binary(a, b, '-', true); })
      .def("__mul__", [](const Tensor& a, py::object b) { return binary(a, b, '*', false); })
      .def("__rmul__", [](const Tensor& a, py::object b) { return binary(a, b, '*', true); })
      .def("__truediv__", [](const Tensor& a, py::object b) { return binary(a, b, '/', false); })
      .def("__rtruediv__", [](const Tensor& a, py::object b) { return binary(a, b, '/', true); })
      .def("__matmul__", [](const Tensor& a, py::object b) { return binary(a, b, '@', false); })
      .def("__rmatmul__", [](const Tensor& a, py::object b) { return binary(a, b, '@', true); })
      .def("__neg__", [](const Tensor& a) { py::gil_scoped_release r; return neg(a); })
      .def("__lt__", [](const Tensor& a, py::object b) { Tensor y = as_tensor_arg(b, &a); py::gil_scoped_release r; return lt(a, y); })
      .def("__le__", [](const Tensor& a, py::object b) { Tensor y = as_tensor_arg(b, &a); py::gil_scoped_release r; return le(a, y); })
      .def("__gt__", [](const Tensor& a, py::object b) { Tensor y = as_tensor_arg(b, &a); py::gil_scoped_release r; return gt(a, y); })
      .def("__ge__", [](const Tensor& a, py::object b) { Tensor y = as_tensor_arg(b, &a); py::gil_scoped_release r; return ge(a, y); })
      .def("__bool__", [](const Tensor& t) {
        if (t.numel() != 1) throw py::value_error("the truth value of a tensor of " + std::to_string(t.numel()) + " elements is ambiguous");
        return t.item() != 0;
      })
      .def("__float__", [](const Tensor& t) { return t.item(); });

  m.def("to_tensor", &to_tensor, py::arg("data"), py::arg("dtype") = py::none(), py::arg("stop_gradient") = true,
        "a new tensor holding a copy of `data` (a NumPy array, a list, a scalar or a tensor); Python floats give "
        "float32, ints int64, arrays keep their dtype");
  m.def("from_numpy", &from_numpy, py::arg("array"), "a tensor sharing a C-contiguous NumPy array's memory (no copy)");
  m.def("zeros", [](const std::vector<int64_t>& shape, const py::object& dtype) {
    return Tensor::zeros(Shape(shape), dtype.is_none() ? DType::f32 : parse_dtype_arg(dtype));
  }, py::arg("shape"), py::arg("dtype") = py::none());
  m.def("ones", [](const std::vector<int64_t>& shape, const py::object& dtype) {
    return Tensor::ones(Shape(shape), dtype.is_none() ? DType::f32 : parse_dtype_arg(dtype));
  }, py::arg("shape"), py::arg("dtype") = py::none());
  m.def("full", [](const std::vector<int64_t>& shape, double value, const py::object& dtype) {
    return Tensor::full(Shape(shape), value, dtype.is_none() ? DType::f32 : parse_dtype_arg(dtype));
  }, py::arg("shape"), py::arg("fill_value"), py::arg("dtype") = py::none());
  m.def("arange", [](int64_t n, const py::object& dtype) {
    return Tensor::arange(n, dtype.is_none() ? DType::i64 : parse_dtype_arg(dtype));
  }, py::arg("n"), py::arg("dtype") = py::none());
  // Philox draws: element i of `stream` under `seed`, the same bits as the C++ rng_fill.
  m.def("rng_fill", [](const Tensor& t, const std::string& dist, double a, double b, uint64_t seed, uint64_t stream) {
    if (dist != "uniform" && dist != "normal") throw py::value_error("distribution '" + dist + "': uniform or normal");
    py::gil_scoped_release release;
    rng_fill(t, dist == "uniform" ? Distribution::uniform : Distribution::normal, a, b, seed, stream);
  }, py::arg("tensor"), py::arg("distribution"), py::arg("a"), py::arg("b"), py::arg("seed"), py::arg("stream"));

  m.def("call_op", &call_registry_op, py::arg("name"),
        "calls the registry's op `name` on tensors (positional) with attributes (keywords)");
  m.def("op_names", [] {
    std::vector<std::string> names;
    for (const OpDef* op : all_ops()) names.emplace_back(op->name);
    return names;
  });
  m.def("op_info", [](const std::string& name) {
    const OpDef& op = op_by_name(name);
    py::dict d;
    d["inputs"] = op.num_inputs;
    d["outputs"] = op.num_outputs;
    d["differentiable"] = op.backward != nullptr;
    d["distributed"] = op.spmd != nullptr;
    d["devices"] = kernel_types(op);
    py::list attrs;
    for (const AttrSpec& a : op_attr_specs(op)) {
      py::object fallback = py::none();
      if (a.fallback) fallback = std::visit([](const auto& v) { return py::cast(v); }, *a.fallback);
      attrs.append(py::make_tuple(a.name, a.type, fallback, !a.fallback && !a.internal, a.internal));
    }
    d["attrs"] = attrs;
    return d;
  });
  m.def("grad_enabled", [] { return grad_enabled(); });
  m.def("set_grad_enabled", [](bool on) {
    const bool before = grad_enabled();
    rank_context().grad_enabled = on;
    return before;
  }, "sets this thread's grad mode; returns the previous one");
}
