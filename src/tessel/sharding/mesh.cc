// ProcessMesh coordinates, groups and text form.
#include "tessel/sharding/mesh.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <set>

#include "tessel/core/error.h"

namespace tessel {

ProcessMesh::ProcessMesh(Shape shape, std::vector<int64_t> ids, std::vector<std::string> dim_names)
    : shape_(std::move(shape)), ids_(std::move(ids)), names_(std::move(dim_names)) {
  TESSEL_CHECK(!shape_.empty(), "process mesh needs at least one dim");
  for (int64_t s : shape_) TESSEL_CHECK(s > 0, "process mesh shape {} has a non-positive dim", shape_str(shape_));
  TESSEL_CHECK(shape_numel(shape_) == static_cast<int64_t>(ids_.size()),
               "process mesh shape {} holds {} ranks but {} process ids were given", shape_str(shape_),
               shape_numel(shape_), ids_.size());
  std::set<int64_t> unique(ids_.begin(), ids_.end());
  TESSEL_CHECK(unique.size() == ids_.size(), "process mesh ids [{}] repeat a rank", fmt::join(ids_, ","));
  for (int64_t id : ids_) TESSEL_CHECK(id >= 0, "process mesh id {} is negative", id);
  if (names_.empty())
    for (size_t i = 0; i < shape_.size(); ++i) names_.push_back(fmt::format("d{}", i));
  TESSEL_CHECK(names_.size() == shape_.size(), "process mesh has {} dims but {} names", shape_.size(), names_.size());
  std::set<std::string> unique_names(names_.begin(), names_.end());
  TESSEL_CHECK(unique_names.size() == names_.size(), "process mesh dim names [{}] repeat", fmt::join(names_, ","));
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
  if (!t.starts_with("mesh(")) {
    Shape shape = parse_shape(t);
    if (shape.empty()) fail("no dims");
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

int64_t ProcessMesh::dim_index(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int64_t>(i);
  TESSEL_THROW("mesh {} has no dim named '{}' (dims: {})", str(), name, fmt::join(names_, ", "));
}

bool ProcessMesh::contains(int64_t rank) const { return std::find(ids_.begin(), ids_.end(), rank) != ids_.end(); }

std::vector<int64_t> ProcessMesh::coord(int64_t rank) const {
  auto it = std::find(ids_.begin(), ids_.end(), rank);
  TESSEL_CHECK(it != ids_.end(), "rank {} is not in mesh {}", rank, str());
  int64_t linear = it - ids_.begin();
  std::vector<int64_t> c(shape_.size());
  for (size_t d = shape_.size(); d-- > 0;) {
    c[d] = linear % shape_[d];
    linear /= shape_[d];
  }
  return c;
}

int64_t ProcessMesh::rank_at(const std::vector<int64_t>& coord) const {
  TESSEL_CHECK(coord.size() == shape_.size(), "mesh {}: coordinate of {} dims", str(), coord.size());
  int64_t linear = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    TESSEL_CHECK(coord[d] >= 0 && coord[d] < shape_[d], "mesh {}: coordinate {} out of range in dim {}", str(),
                 coord[d], d);
    linear = linear * shape_[d] + coord[d];
  }
  return ids_[static_cast<size_t>(linear)];
}

std::vector<int64_t> ProcessMesh::group_along(int64_t dim, int64_t rank) const {
  std::vector<int64_t> c = coord(rank);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < shape_.at(static_cast<size_t>(dim)); ++i) {
    c[static_cast<size_t>(dim)] = i;
    out.push_back(rank_at(c));
  }
  return out;
}

std::vector<std::vector<int64_t>> ProcessMesh::groups_along(int64_t dim) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t id : ids_)
    if (coord(id)[static_cast<size_t>(dim)] == 0) out.push_back(group_along(dim, id));
  return out;
}

ProcessMesh ProcessMesh::sub_mesh(int64_t dim, int64_t index) const {
  TESSEL_CHECK(dim >= 0 && dim < ndim() && index >= 0 && index < shape_[static_cast<size_t>(dim)],
               "mesh {}: no sub-mesh at index {} of dim {}", str(), index, dim);
  if (ndim() == 1) return ProcessMesh({1}, {ids_[static_cast<size_t>(index)]}, {names_[0]});
  Shape shape;
  std::vector<std::string> names;
  for (int64_t d = 0; d < ndim(); ++d)
    if (d != dim) {
      shape.push_back(shape_[d]);
      names.push_back(names_[d]);
    }
  std::vector<int64_t> ids;
  for (int64_t id : ids_)
    if (coord(id)[static_cast<size_t>(dim)] == index) ids.push_back(id);
  return ProcessMesh(shape, ids, names);
}

std::string ProcessMesh::str() const {
  std::string dims;
  for (size_t i = 0; i < shape_.size(); ++i) dims += fmt::format("{}{}={}", i ? "," : "", names_[i], shape_[i]);
  // Nested brackets, row-major.
  std::string body;
  std::vector<int64_t> idx(shape_.size(), 0);
  std::function<void(size_t, int64_t&)> emit = [&](size_t d, int64_t& pos) {
    body += '[';
    for (int64_t i = 0; i < shape_[d]; ++i) {
      if (i) body += ',';
      if (d + 1 == shape_.size()) body += std::to_string(ids_[static_cast<size_t>(pos++)]);
      else emit(d + 1, pos);
    }
    body += ']';
  };
  int64_t pos = 0;
  emit(0, pos);
  return fmt::format("mesh({}){}", dims, body);
}

}  // namespace tessel
