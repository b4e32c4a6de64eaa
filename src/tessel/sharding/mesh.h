// ProcessMesh: an N-D array of process ids with named dims, e.g. mesh(dp=2,tp=2)[[0,1],[2,3]].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/shape.h"

namespace tessel {

class ProcessMesh {
 public:
  ProcessMesh() = default;
  // `ids` row-major over `shape`; names default to d0, d1, ...
  ProcessMesh(Shape shape, std::vector<int64_t> ids, std::vector<std::string> dim_names = {});
  // Ranks 0..prod(shape)-1 in row-major order.
  static ProcessMesh iota(Shape shape, std::vector<std::string> dim_names = {});
  // Parses "mesh(dp=2,tp=2)[[0,1],[2,3]]", "mesh(dp=2,tp=2)" (iota) or "2x2" (iota, d0, d1), of
  // at most kMaxMeshSize processes.
  static ProcessMesh parse(std::string_view text);
  static constexpr int64_t kMaxMeshSize = int64_t{1} << 24;

  int64_t ndim() const { return static_cast<int64_t>(data().shape.size()); }
  int64_t size() const { return static_cast<int64_t>(data().ids.size()); }
  const Shape& shape() const { return data().shape; }
  int64_t dim_size(int64_t dim) const { return data().shape.at(static_cast<size_t>(dim)); }
  const std::vector<std::string>& dim_names() const { return data().names; }
  // Index of the dim called `name`; throws listing the names when absent.
  int64_t dim_index(std::string_view name) const;
  // Index of the dim called `name`, or -1 when the mesh has none.
  int64_t find_dim(std::string_view name) const;
  const std::vector<int64_t>& process_ids() const { return data().ids; }

  bool contains(int64_t rank) const;
  // Coordinates of `rank` in the mesh; throws when absent.
  std::vector<int64_t> coord(int64_t rank) const;
  int64_t rank_at(const std::vector<int64_t>& coord) const;
  // The ranks along `dim` that share every other coordinate with `rank` (a group of the dim).
  std::vector<int64_t> group_along(int64_t dim, int64_t rank) const;
  // Every group along `dim`, each in coordinate order.
  std::vector<std::vector<int64_t>> groups_along(int64_t dim) const;
  // The (ndim-1)-D mesh at `index` along `dim`.
  ProcessMesh sub_mesh(int64_t dim, int64_t index) const;

  std::string str() const;  // "mesh(dp=2,tp=2)[[0,1],[2,3]]"
  bool operator==(const ProcessMesh& o) const { return d_ == o.d_ || (data().shape == o.data().shape && data().ids == o.data().ids); }

 private:
  // Immutable and shared: copying a mesh (every DistAttr holds one) costs a reference count.
  struct Data {
    Shape shape;
    std::vector<int64_t> ids;
    std::vector<std::string> names;
  };
  static const Data& empty_data();
  const Data& data() const { return d_ ? *d_ : empty_data(); }
  std::shared_ptr<const Data> d_;
};

}  // namespace tessel
