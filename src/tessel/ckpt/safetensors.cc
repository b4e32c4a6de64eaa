// safetensors reading (mmap, validated) and writing (atomic rename).
#include "tessel/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessel/core/json.h"
#include "tessel/core/view.h"

namespace tessel {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit

struct FileDType {
  const char* name;
  size_t size;
  bool supported;
  DType dtype;
};
constexpr FileDType kFileDTypes[] = {
    {"F32", 4, true, DType::f32},   {"F64", 8, true, DType::f64},   {"BF16", 2, true, DType::bf16},
    {"I32", 4, true, DType::i32},   {"I64", 8, true, DType::i64},   {"BOOL", 1, true, DType::b8},
    {"F16", 2, true, DType::f32},  // widened to f32 on load
    {"I8", 1, false, DType::f32},   {"U8", 1, false, DType::f32},   {"I16", 2, false, DType::f32},
    {"U16", 2, false, DType::f32},  {"U32", 4, false, DType::f32},  {"U64", 8, false, DType::f32},
    {"F8_E4M3", 1, false, DType::f32}, {"F8_E5M2", 1, false, DType::f32},
};

const FileDType* file_dtype(const std::string& name) {
  for (const FileDType& d : kFileDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

std::string safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::b8: return "BOOL";
  }
  return "?";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  auto fail = [&](const std::string& why) -> void { throw CheckpointError(fmt::format("safetensors file '{}': {}", path, why)); };

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(fmt::format("cannot stat: {}", std::strerror(errno)));
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail(fmt::format("truncated: {} bytes, shorter than the 8-byte header length", size));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) fail(fmt::format("cannot map: {}", std::strerror(errno)));
  f.mapping_ = std::shared_ptr<void>(map, [size](void* p) { ::munmap(p, size); });
  const char* base = static_cast<const char*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(base[i]);
  if (header_len > kMaxHeader) fail(fmt::format("header length {} exceeds the {} byte limit", header_len, kMaxHeader));
  if (header_len > size - 8)
    fail(fmt::format("truncated: header length {} but only {} bytes follow the length field", header_len, size - 8));
  std::string_view header(base + 8, header_len);
  if (header.empty() || header.front() != '{') fail("the header is not a JSON object");
  Json j;
  try {
    j = Json::parse(header);
  } catch (const Error& e) {
    fail(fmt::format("bad JSON header: {}", e.what()));
  }
  f.data_ = base + 8 + header_len;
  f.data_size_ = size - 8 - header_len;
  f.data_start_ = 8 + header_len;

  for (const auto& [name, v] : j.as_object()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (const auto& [k, mv] : v.as_object()) {
        if (!mv.is_string()) fail(fmt::format("__metadata__ value of \"{}\" is not a string", k));
        f.metadata_[k] = mv.as_string();
      }
      continue;
    }
    // A named copy of the binding: clang before 16 cannot capture structured bindings.
    auto bad = [&, &tensor = name](const std::string& why) { fail(fmt::format("tensor \"{}\": {}", tensor, why)); };
    if (!v.is_object()) bad("entry is not an object");
    const Json* dt = v.find("dtype");
    const Json* shape = v.find("shape");
    const Json* offsets = v.find("data_offsets");
    if (!dt || !dt->is_string()) bad("missing or non-string \"dtype\"");
    if (!shape || !shape->is_array()) bad("missing or non-array \"shape\"");
    if (!offsets || !offsets->is_array() || offsets->as_array().size() != 2) bad("\"data_offsets\" is not [begin, end]");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dt->as_string();
    const FileDType* fd_type = file_dtype(e.dtype);
    if (!fd_type) bad(fmt::format("unknown dtype \"{}\"", e.dtype));
    // The bytes the dims span, zero dims counted as 1 (strides reach that far even when the
    // tensor is empty), must stay below 2^62; numel·size then cannot wrap.
    const uint64_t max_span = (uint64_t{1} << 62) / fd_type->size;
    uint64_t numel = 1, span = 1;
    for (const Json& s : shape->as_array()) {
      if (!s.is_int() || s.as_int() < 0) bad("shape holds a non-integer or negative size");
      uint64_t dim = static_cast<uint64_t>(s.as_int());
      if (dim > 1 && span > max_span / dim) bad(fmt::format("shape {} is too large (more than 2^62 bytes)", shape->dump()));
      span *= std::max<uint64_t>(dim, 1);
      numel *= dim;
      e.shape.push_back(s.as_int());
    }
    const Json& b = offsets->as_array()[0];
    const Json& en = offsets->as_array()[1];
    if (!b.is_int() || !en.is_int() || b.as_int() < 0 || en.as_int() < b.as_int())
      bad("data_offsets must be integers with 0 <= begin <= end");
    e.begin = static_cast<uint64_t>(b.as_int());
    e.end = static_cast<uint64_t>(en.as_int());
    if (e.end > f.data_size_)
      bad(fmt::format("data_offsets [{}, {}] run past the data section of {} bytes (truncated file?)", e.begin, e.end,
                      f.data_size_));
    if (e.end - e.begin != numel * fd_type->size)
      bad(fmt::format("holds {} bytes but {} of shape {} needs {}", e.end - e.begin, e.dtype, shape_str(e.shape),
                      numel * fd_type->size));
    f.entries_.push_back(std::move(e));
  }
  // Tensors must tile the data section: sorted by offset, no overlap, no gap.
  std::vector<const SafetensorsEntry*> order;
  for (const SafetensorsEntry& e : f.entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t cursor = 0;
  for (const SafetensorsEntry* e : order) {
    if (e->begin < cursor) fail(fmt::format("tensor \"{}\" at [{}, {}] overlaps the previous tensor ending at {}", e->name, e->begin, e->end, cursor));
    if (e->begin > cursor) fail(fmt::format("bytes [{}, {}) before tensor \"{}\" belong to no tensor", cursor, e->begin, e->name));
    cursor = e->end;
  }
  if (cursor != f.data_size_)
    fail(fmt::format("the data section has {} bytes but the tensors cover {}", f.data_size_, cursor));
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw CheckpointError(fmt::format("safetensors file '{}' has no tensor \"{}\"", path_, name));
  return entries_[it->second];
}

Tensor SafetensorsFile::load(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const FileDType* fd = file_dtype(e.dtype);
  if (!fd->supported)
    throw CheckpointError(fmt::format("safetensors file '{}': tensor \"{}\" has dtype {}, which tessel does not load",
                                      path_, name, e.dtype));
  const char* src = data_ + e.begin;
  int64_t numel = shape_numel(e.shape);
  if (e.dtype == "BOOL") {  // any other byte would be an invalid C++ bool
    const char* bad = std::find_if(src, src + numel, [](char b) { return static_cast<unsigned char>(b) > 1; });
    if (bad != src + numel)
      throw CheckpointError(fmt::format("safetensors file '{}': tensor \"{}\" (BOOL) holds byte {} at element {}; "
                                        "BOOL data must be 0 or 1",
                                        path_, name, static_cast<unsigned char>(*bad), bad - src));
  }
  // Loaded tensors are host tensors: views of the mapping, or host memory of their own.
  if (e.dtype == "F16") {
    auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      (*out)[static_cast<size_t>(i)] = half_to_float(h);
    }
    auto storage = Storage::wrap(out->data(), out->size() * sizeof(float), Device{}, [out] {});
    return Tensor::from_storage(storage, 0, e.shape, contiguous_strides(e.shape), DType::f32);
  }
  if (reinterpret_cast<uintptr_t>(src) % fd->size == 0) {
    auto keep = mapping_;
    auto storage = Storage::wrap(const_cast<char*>(src), e.end - e.begin, Device{}, [keep] {});
    // The mapping is private and read-only: copy before writing into these tensors.
    return Tensor::from_storage(storage, 0, e.shape, contiguous_strides(e.shape), fd->dtype);
  }
  Tensor t = Tensor::empty(e.shape, fd->dtype, Device{});
  std::memcpy(t.raw_data(), src, e.end - e.begin);
  return t;
}

std::map<std::string, Tensor> SafetensorsFile::load_all() const {
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : entries_) out[e.name] = load(e.name);
  return out;
}

std::string safetensors_header(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  Json header = Json::Object{};
  for (const SafetensorsEntry& e : entries) {
    TESSEL_CHECK_AS(CheckpointError, !e.name.empty() && e.name != "__metadata__",
                    "safetensors '{}': a tensor may not be called \"{}\"", path, e.name);
    Json entry = Json::Object{};
    entry["dtype"] = e.dtype;
    Json::Array shape;
    for (int64_t s : e.shape) shape.emplace_back(s);
    entry["shape"] = Json(std::move(shape));
    entry["data_offsets"] = Json(Json::Array{Json(e.begin), Json(e.end)});
    header[e.name] = std::move(entry);
  }
  if (!metadata.empty()) {
    Json m = Json::Object{};
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';  // data starts 8-byte aligned
  const uint64_t n = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

void widen_f16(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

size_t safetensors_dtype_size(const std::string& dtype) {
  const FileDType* fd = file_dtype(dtype);
  TESSEL_CHECK_AS(CheckpointError, fd != nullptr, "unknown safetensors dtype '{}'", dtype);
  return fd->size;
}

DType safetensors_tessel_dtype(const std::string& dtype) {
  const FileDType* fd = file_dtype(dtype);
  TESSEL_CHECK_AS(CheckpointError, fd != nullptr && fd->supported && dtype != "F16",
                  "safetensors dtype '{}' has no tessel dtype of the same bytes", dtype);
  return fd->dtype;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  std::vector<Tensor> contiguous;
  for (const auto& [name, t] : tensors) {
    TESSEL_CHECK_AS(CheckpointError, t.defined(), "save_safetensors '{}': tensor \"{}\" is undefined", path, name);
    Tensor c = view::contiguous(t.to(Device{}));  // written from host memory
    entries.push_back({name, safetensors_dtype(c.dtype()), c.shape(), offset, offset + c.nbytes()});
    offset += c.nbytes();
    contiguous.push_back(c);
  }
  const std::string head = safetensors_header(path, entries, metadata);

  std::filesystem::path target(path);
  std::filesystem::path tmp = target;
  tmp += fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw CheckpointWriteError(fmt::format("save_safetensors: cannot create '{}': {}", tmp.string(), std::strerror(errno)));
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    for (const Tensor& c : contiguous) out.write(static_cast<const char*>(c.raw_data()), static_cast<std::streamsize>(c.nbytes()));
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw CheckpointWriteError(fmt::format("save_safetensors: writing '{}' failed (disk full?)", tmp.string()));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw CheckpointWriteError(fmt::format("save_safetensors: cannot move the new file over '{}': {}", path, ec.message()));
  }
}

}  // namespace tessel
