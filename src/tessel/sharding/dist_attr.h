// DistAttr: a mesh and one placement per mesh dim — the complete description of how a
// global tensor is spread over ranks. Text form: mesh(dp=2,tp=2)[S(0),R].
#pragma once

#include <string>
#include <string_view>

#include "tessel/core/shape.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/placement.h"

namespace tessel {

struct DistAttr {
  ProcessMesh mesh;
  Placements placements;

  DistAttr() = default;
  // Throws when the placement count differs from the mesh's dims.
  DistAttr(ProcessMesh m, Placements p);
  static DistAttr parse(std::string_view text);
  std::string str() const;
  bool operator==(const DistAttr&) const = default;

  bool is_replicated() const;
  bool has_partial() const;
  // Mesh dims that shard tensor dim `d`, in mesh-dim order.
  std::vector<int64_t> mesh_dims_sharding(int64_t d) const;
  // Validates against a global shape (shard dims in range); throws naming both.
  void check(const Shape& global_shape, std::string_view what) const;
  // The local shape and offset of `rank`'s piece of a tensor of `global_shape` (balanced
  // splits; several mesh dims sharding one tensor dim split it in mesh-dim order).
  Shape local_shape(const Shape& global_shape, int64_t rank) const;
  Shape local_offset(const Shape& global_shape, int64_t rank) const;
};

}  // namespace tessel
