// DistAttr validation, local pieces and text form.
#include "tessel/sharding/dist_attr.h"

#include "tessel/core/error.h"

namespace tessel {

DistAttr::DistAttr(ProcessMesh m, Placements p) : mesh(std::move(m)), placements(std::move(p)) {
  TESSEL_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(),
               "dist attr: {} placements {} for a mesh of {} dims {}", placements.size(), placements_str(placements),
               mesh.ndim(), mesh.str());
}

DistAttr DistAttr::parse(std::string_view text) {
  // Placements hold no brackets, so the placement list starts at the last '['; the mesh
  // (with or without an id list) is everything before it.
  size_t open = text.rfind('[');
  TESSEL_CHECK(open != std::string_view::npos && open > 0 && text.back() == ']',
               "bad dist attr '{}' (expected like mesh(dp=2,tp=2)[S(0),R])", text);
  return DistAttr(ProcessMesh::parse(text.substr(0, open)), parse_placements(text.substr(open)));
}

std::string DistAttr::str() const { return mesh.str() + placements_str(placements); }

bool DistAttr::is_replicated() const {
  for (const Placement& p : placements)
    if (!p.is_replicate()) return false;
  return true;
}

bool DistAttr::has_partial() const {
  for (const Placement& p : placements)
    if (p.is_partial()) return true;
  return false;
}

std::vector<int64_t> DistAttr::mesh_dims_sharding(int64_t d) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < placements.size(); ++i)
    if (placements[i].is_shard(d)) out.push_back(static_cast<int64_t>(i));
  return out;
}

void DistAttr::check(const Shape& global_shape, std::string_view what) const {
  for (const Placement& p : placements)
    TESSEL_CHECK(!p.is_shard() || p.dim < static_cast<int64_t>(global_shape.size()),
                 "{}: placement {} shards dim {} but the tensor of shape {} has {} dims", what, p.str(), p.dim,
                 shape_str(global_shape), global_shape.size());
}

Shape DistAttr::local_shape(const Shape& global_shape, int64_t rank) const {
  Shape shape = global_shape;
  if (!mesh.contains(rank)) return Shape(global_shape.size(), 0);
  std::vector<int64_t> c = mesh.coord(rank);
  for (size_t m = 0; m < placements.size(); ++m)
    if (placements[m].is_shard()) {
      int64_t d = placements[m].dim;
      shape[d] = split_size(shape[d], mesh.dim_size(static_cast<int64_t>(m)), c[m]);
    }
  return shape;
}

Shape DistAttr::local_offset(const Shape& global_shape, int64_t rank) const {
  Shape offset(global_shape.size(), 0);
  Shape extent = global_shape;
  if (!mesh.contains(rank)) return offset;
  std::vector<int64_t> c = mesh.coord(rank);
  for (size_t m = 0; m < placements.size(); ++m)
    if (placements[m].is_shard()) {
      int64_t d = placements[m].dim;
      int64_t k = mesh.dim_size(static_cast<int64_t>(m));
      offset[d] += split_offset(extent[d], k, c[m]);
      extent[d] = split_size(extent[d], k, c[m]);
    }
  return offset;
}

}  // namespace tessel
