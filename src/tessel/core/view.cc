// Raw views, and copies and fills dispatched to the device of the tensors they write.
#include "tessel/core/view.h"

#include <algorithm>

#include "tessel/core/cpu/copy_kernels.h"

namespace tessel::view {

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  TESSEL_ASSERT(shape.size() == strides.size(), "as_strided: {} dims but {} strides", shape.size(), strides.size());
  return Tensor::from_storage(t.storage(), offset, shape, strides, t.dtype());
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  int64_t d = normalize_dim(dim, t.dim(), "slice");
  int64_t n = t.size(d);
  TESSEL_CHECK(step > 0, "slice: step must be positive, got {}", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = t.shape(), strides = t.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return as_strided(t, shape, strides, t.offset() + start * t.stride(d));
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  int64_t d = normalize_dim(dim, t.dim(), "select");
  int64_t n = t.size(d);
  TESSEL_CHECK(index >= -n && index < n, "select: index {} out of range for dim {} of size {}", index, d, n);
  if (index < 0) index += n;
  Shape shape = t.shape(), strides = t.strides();
  int64_t offset = t.offset() + index * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return as_strided(t, shape, strides, offset);
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  TESSEL_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), "permute: {} dims given for a tensor of {} dims",
               dims.size(), t.dim());
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = normalize_dim(dims[i], t.dim(), "permute");
    TESSEL_CHECK(!seen[d], "permute: dim {} appears twice in [{}]", d, fmt::join(dims, ", "));
    seen[d] = true;
    shape[i] = t.size(d);
    strides[i] = t.stride(d);
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) dims[i] = i;
  std::swap(dims[normalize_dim(dim0, t.dim(), "transpose")], dims[normalize_dim(dim1, t.dim(), "transpose")]);
  return permute(t, dims);
}

Shape infer_reshape(const Shape& shape, int64_t numel, std::string_view op) {
  Shape out = shape;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TESSEL_CHECK(infer_at < 0, "{}: more than one -1 in shape {}", op, shape_str(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      TESSEL_CHECK(out[i] >= 0, "{}: negative size in shape {}", op, shape_str(shape));
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    TESSEL_CHECK(known != 0 && numel % known == 0, "{}: cannot infer -1 in shape {} for {} elements", op,
                 shape_str(shape), numel);
    out[infer_at] = numel / known;
  }
  TESSEL_CHECK(shape_numel(out) == numel, "{}: shape {} has {} elements but the input has {}", op, shape_str(shape),
               shape_numel(out), numel);
  return out;
}

std::optional<Tensor> try_view(const Tensor& t, const Shape& shape) {
  if (t.is_contiguous() || t.numel() == 0) return as_strided(t, shape, contiguous_strides(shape), t.offset());
  // Drop size-1 input dims, then walk groups of input dims that map onto groups of output
  // dims with equal products; a group is viewable when its input dims are nested
  // contiguously (stride[k] == stride[k+1] * size[k+1]).
  Shape in, in_st;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) {
      in.push_back(t.size(d));
      in_st.push_back(t.stride(d));
    }
  Shape out_st(shape.size(), 1);
  size_t i = 0, o = 0;
  while (o < shape.size()) {
    if (shape[o] == 1) {
      out_st[o] = i < in.size() ? in_st[i] * in[i] : 1;
      ++o;
      continue;
    }
    if (i >= in.size()) return std::nullopt;
    size_t i0 = i, o0 = o;
    int64_t pi = in[i++], po = shape[o++];
    while (pi != po) {
      if (pi < po) {
        if (i >= in.size()) return std::nullopt;
        pi *= in[i++];
      } else {
        if (o >= shape.size()) return std::nullopt;
        po *= shape[o++];
      }
    }
    for (size_t k = i0; k + 1 < i; ++k)
      if (in_st[k] != in_st[k + 1] * in[k + 1]) return std::nullopt;
    int64_t s = in_st[i - 1];
    for (size_t k = o; k-- > o0;) {
      out_st[k] = s;
      s *= shape[k];
    }
  }
  if (i != in.size()) return std::nullopt;
  return as_strided(t, shape, out_st, t.offset());
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  Shape target = infer_reshape(shape, t.numel(), "reshape");
  if (auto v = try_view(t, target)) return *v;
  return as_strided(clone(t), target, contiguous_strides(target), 0);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  TESSEL_CHECK(shape.size() >= t.shape().size(), "expand: cannot expand {} to fewer dims {}", shape_str(t.shape()),
               shape_str(shape));
  size_t lead = shape.size() - t.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < t.shape().size(); ++i) {
    int64_t from = t.shape()[i], to = shape[lead + i];
    TESSEL_CHECK(from == to || from == 1, "expand: cannot expand {} to {} (dim {}: {} vs {})", shape_str(t.shape()),
                 shape_str(shape), lead + i, from, to);
    strides[lead + i] = from == to ? t.strides()[i] : 0;
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  int64_t d = normalize_dim(dim, t.dim() + 1, "unsqueeze");
  Shape shape = t.shape(), strides = t.strides();
  int64_t st = d < t.dim() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return as_strided(t, shape, strides, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  int64_t d = normalize_dim(dim, t.dim(), "squeeze");
  TESSEL_CHECK(t.size(d) == 1, "squeeze: dim {} has size {}, not 1", d, t.size(d));
  Shape shape = t.shape(), strides = t.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return as_strided(t, shape, strides, t.offset());
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor clone(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy(out, t);
  return out;
}

namespace {

// dst = src on one device: the host loop for the CPU and for devices that run CPU kernels,
// the device's own kernel otherwise.
void same_device_copy(const Tensor& dst, const Tensor& src) {
  Device d = dst.device();
  if (d.is_cpu()) return cpu::copy(dst, src);
  DeviceBackend& backend = device_backend(d);
  if (!backend.runs_cpu_kernels()) return backend.copy_strided(dst, src);
  KernelScope scope(d);
  cpu::copy(dst, src);
}

// Bytes from one contiguous tensor to another of the same dtype and shape on another device.
void move_bytes(const Tensor& to, const Tensor& from) {
  Device td = to.device(), fd = from.device();
  if (!td.is_cpu() && !fd.is_cpu() && td.type != fd.type) {  // two device types: through the host
    Tensor host = Tensor::empty(from.shape(), from.dtype(), Device{});
    move_bytes(host, from);
    move_bytes(to, host);
    return;
  }
  Device side = td.is_cpu() ? fd : td;
  device_backend(side).copy_bytes(to.raw_data(), td, from.raw_data(), fd, to.nbytes(), Stream{side, 0});
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.is_meta() || src.is_meta()) return;  // tracing: the copy's place in the step is what counts
  Tensor s = src.shape() == dst.shape() ? src : expand(src, dst.shape());
  if (dst.numel() == 0) return;
  if (dst.device() == s.device()) return same_device_copy(dst, s);
  // Across devices bytes move between contiguous tensors of dst's dtype; conversion and
  // striding happen on whichever side needs them.
  Tensor from = s;
  if (s.dtype() != dst.dtype() || !s.is_contiguous()) {
    from = Tensor::empty(s.shape(), dst.dtype(), s.device());
    same_device_copy(from, s);
  }
  Tensor to = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  move_bytes(to, from);
  if (!to.is_same(dst)) same_device_copy(dst, to);
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  copy(out, t);
  return out;
}

void fill(const Tensor& t, double value) {
  if (t.is_meta() || t.numel() == 0) return;
  Device d = t.device();
  if (d.is_cpu()) return cpu::fill(t, value);
  DeviceBackend& backend = device_backend(d);
  if (!backend.runs_cpu_kernels()) return backend.fill(t, value);
  KernelScope scope(d);
  cpu::fill(t, value);
}

}  // namespace tessel::view
