// Placements: how a tensor is laid out along one mesh dim. Shard(d) splits tensor dim d
// (balanced, larger pieces first), Replicate keeps a full copy, Partial(op) holds a partial
// value still to be reduced with op. Text forms: S(0), R, P(sum).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/reduce_op.h"

namespace tessel {

struct Placement {
  enum class Kind : uint8_t { replicate, shard, partial };

  Kind kind = Kind::replicate;
  int64_t dim = -1;                 // tensor dim, for shard
  ReduceOp reduce = ReduceOp::sum;  // for partial

  bool is_replicate() const { return kind == Kind::replicate; }
  bool is_shard() const { return kind == Kind::shard; }
  bool is_shard(int64_t d) const { return kind == Kind::shard && dim == d; }
  bool is_partial() const { return kind == Kind::partial; }
  std::string str() const;
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::shard || dim == o.dim) && (kind != Kind::partial || reduce == o.reduce);
  }
};

inline Placement Shard(int64_t dim) { return Placement{Placement::Kind::shard, dim, ReduceOp::sum}; }
inline Placement Replicate() { return Placement{}; }
inline Placement Partial(ReduceOp op = ReduceOp::sum) { return Placement{Placement::Kind::partial, -1, op}; }

using Placements = std::vector<Placement>;

// Parses "S(0)", "R", "P", "P(sum)"; throws naming the text.
Placement parse_placement(std::string_view text);
// "[S(0), R]"
std::string placements_str(const Placements& p);
// Parses "[S(0),R]" or "S(0),R".
Placements parse_placements(std::string_view text);

}  // namespace tessel
