// ProcessMesh coordinates, groups and text form.
#include "tessel/sharding/mesh.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <set>

#include "tessel/core/error.h"

namespace tessel {

ProcessMesh::ProcessMesh(Shape shape, std::vector<int64_t> ids, std::vector<std::string> dim_names) {
  Data data{std::move(shape), std::move(ids), std::move(dim_names)};
  TESSEL_CHECK(!data.shape.empty(), "process mesh needs at least one dim");
  for (int64_t s : data.shape) TESSEL_CHECK(s > 0, "process mesh shape {} has a non-positive dim", shape_str(data.shape));
  TESSEL_CHECK(shape_numel(data.shape) == static_cast<int64_t>(data.ids.size()),
               "process mesh shape {} holds {} ranks but {} process ids were given", shape_str(data.shape),
               shape_numel(data.shape), data.ids.size());
  std::set<int64_t> unique(data.ids.begin(), data.ids.end());
  TESSEL_CHECK(unique.size() == data.ids.size(), "process mesh ids [{}] repeat a rank", fmt::join(data.ids, ","));
  for (int64_t id : data.ids) TESSEL_CHECK(id >= 0, "process mesh id {} is negative", id);
  if (data.names.empty())
    for (size_t i = 0; i < data.shape.size(); ++i) data.names.push_back(fmt::format("d{}", i));
  TESSEL_CHECK(data.names.size() == data.shape.size(), "process mesh has {} dims but {} names", data.shape.size(), data.names.size());
  std::set<std::string> unique_names(data.names.begin(), data.names.end());
  TESSEL_CHECK(unique_names.size() == data.names.size(), "process mesh dim names [{}] repeat", fmt::join(data.names, ","));
  d_ = std::make_shared<const Data>(std::move(data));
}

const ProcessMesh::Data& ProcessMesh::empty_data() {
  static const Data empty;
  return empty;
}

ProcessMesh ProcessMesh::iota(Shape shape, std::vector<std::string> dim_names) {
  std::vector<int64_t> ids(static_cast<size_t>(std::max<int64_t>(shape_numel(shape), 0)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  return ProcessMesh(std::move(shape), std::move(ids), std::move(dim_names));
}

ProcessMesh ProcessMesh::parse(std::string_view text) {
  std::string_view t = text;
  auto fail = [&](std::string_view why) {
    TESSEL_THROW("bad mesh '{}': {} (expected like mesh(dp=2,tp=2)[[0,1],[2,3]] or 2x2)", text, why);
  };
  // Sizes whose product overflows, or that no machine has, would exhaust memory listing ranks.
  auto check_total = [&](const Shape& shape) {
    int64_t total = 1;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(total, std::max<int64_t>(d, 1), &total) || total > kMaxMeshSize)
        fail(fmt::format("more than {} processes", kMaxMeshSize));
  };
  if (!t.starts_with("mesh(")) {
    Shape shape = parse_shape(t);
    if (shape.empty()) fail("no dims");
    check_total(shape);
    return iota(shape);
  }
  size_t close = t.find(')');
  if (close == std::string_view::npos) fail("missing ')'");
  std::string_view dims = t.substr(5, close - 5);
  Shape shape;
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= dims.size()) {
    size_t comma = dims.find(',', start);
    std::string_view item = dims.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) fail("a dim is not name=size");
    std::string name(item.substr(0, eq));
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.front()))) name.erase(0, 1);
    int64_t size = 0;
    std::string_view num = item.substr(eq + 1);
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), size);
    if (ec != std::errc() || size <= 0) fail("a dim size is not a positive integer");
    names.push_back(name);
    shape.push_back(size);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  check_total(shape);
  std::string_view rest = t.substr(close + 1);
  if (rest.empty()) return iota(shape, names);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < rest.size();) {
    if (std::isdigit(static_cast<unsigned char>(rest[i]))) {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(rest.data() + i, rest.data() + rest.size(), v);
      ids.push_back(v);
      i = static_cast<size_t>(ptr - rest.data());
    } else if (rest[i] == '[' || rest[i] == ']' || rest[i] == ',' || rest[i] == ' ') {
      ++i;
    } else {
      fail("unexpected character in the id list");
    }
  }
  return ProcessMesh(shape, ids, names);
}

int64_t ProcessMesh::find_dim(std::string_view name) const {
  for (size_t i = 0; i < data().names.size(); ++i)
    if (data().names[i] == name) return static_cast<int64_t>(i);
  return -1;
}

int64_t ProcessMesh::dim_index(std::string_view name) const {
  if (const int64_t at = find_dim(name); at >= 0) return at;
  TESSEL_THROW("mesh {} has no dim named '{}' (dims: {})", str(), name, fmt::join(data().names, ", "));
}

bool ProcessMesh::contains(int64_t rank) const { return std::find(data().ids.begin(), data().ids.end(), rank) != data().ids.end(); }

std::vector<int64_t> ProcessMesh::coord(int64_t rank) const {
  auto it = std::find(data().ids.begin(), data().ids.end(), rank);
  TESSEL_CHECK(it != data().ids.end(), "rank {} is not in mesh {}", rank, str());
  int64_t linear = it - data().ids.begin();
  std::vector<int64_t> c(data().shape.size());
  for (size_t d = data().shape.size(); d-- > 0;) {
    c[d] = linear % data().shape[d];
    linear /= data().shape[d];
  }
  return c;
}

int64_t ProcessMesh::rank_at(const std::vector<int64_t>& coord) const {
  TESSEL_CHECK(coord.size() == data().shape.size(), "mesh {}: coordinate of {} dims", str(), coord.size());
  int64_t linear = 0;
  for (size_t d = 0; d < data().shape.size(); ++d) {
    TESSEL_CHECK(coord[d] >= 0 && coord[d] < data().shape[d], "mesh {}: coordinate {} out of range in dim {}", str(),
                 coord[d], d);
    linear = linear * data().shape[d] + coord[d];
  }
  return data().ids[static_cast<size_t>(linear)];
}

std::vector<int64_t> ProcessMesh::group_along(int64_t dim, int64_t rank) const {
  std::vector<int64_t> c = coord(rank);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < data().shape.at(static_cast<size_t>(dim)); ++i) {
    c[static_cast<size_t>(dim)] = i;
    out.push_back(rank_at(c));
  }
  return out;
}

std::vector<std::vector<int64_t>> ProcessMesh::groups_along(int64_t dim) const {
  std::vector<std::vector<int64_t>> out;
  int64_t stride = 1;
  for (int64_t d = dim + 1; d < ndim(); ++d) stride *= data().shape[static_cast<size_t>(d)];
  const int64_t size = data().shape.at(static_cast<size_t>(dim));
  for (size_t p = 0; p < data().ids.size(); ++p) {
    if (static_cast<int64_t>(p) / stride % size != 0) continue;
    std::vector<int64_t> group;
    for (int64_t i = 0; i < size; ++i) group.push_back(data().ids[p + static_cast<size_t>(i * stride)]);
    out.push_back(std::move(group));
  }
  return out;
}

ProcessMesh ProcessMesh::sub_mesh(int64_t dim, int64_t index) const {
  TESSEL_CHECK(dim >= 0 && dim < ndim() && index >= 0 && index < data().shape[static_cast<size_t>(dim)],
               "mesh {}: no sub-mesh at index {} of dim {}", str(), index, dim);
  if (ndim() == 1) return ProcessMesh({1}, {data().ids[static_cast<size_t>(index)]}, {data().names[0]});
  Shape shape;
  std::vector<std::string> names;
  for (int64_t d = 0; d < ndim(); ++d)
    if (d != dim) {
      shape.push_back(data().shape[d]);
      names.push_back(data().names[d]);
    }
  // The ids in row-major order: position p sits at index (p / stride) % size along `dim` (no
  // search per id: meshes of thousands of ranks are sliced while a step is traced).
  int64_t stride = 1;
  for (int64_t d = dim + 1; d < ndim(); ++d) stride *= data().shape[static_cast<size_t>(d)];
  std::vector<int64_t> ids;
  for (size_t p = 0; p < data().ids.size(); ++p)
    if (static_cast<int64_t>(p) / stride % data().shape[static_cast<size_t>(dim)] == index) ids.push_back(data().ids[p]);
  return ProcessMesh(shape, ids, names);
}

std::string ProcessMesh::str() const {
  std::string dims;
  for (size_t i = 0; i < data().shape.size(); ++i) dims += fmt::format("{}{}={}", i ? "," : "", data().names[i], data().shape[i]);
  // Nested brackets, row-major.
  std::string body;
  std::vector<int64_t> idx(data().shape.size(), 0);
  std::function<void(size_t, int64_t&)> emit = [&](size_t d, int64_t& pos) {
    body += '[';
    for (int64_t i = 0; i < data().shape[d]; ++i) {
      if (i) body += ',';
      if (d + 1 == data().shape.size()) body += std::to_string(data().ids[static_cast<size_t>(pos++)]);
      else emit(d + 1, pos);
    }
    body += ']';
  };
  int64_t pos = 0;
  emit(0, pos);
  return fmt::format("mesh({}){}", dims, body);
}

}  // namespace tessel
