// Reshard planning (Dijkstra over placement lists, one mesh; send/recv between meshes) and the
// printing of plans. Pure values: the dist layer runs the plans (dist/reshard.cc), SPMD rules
// price their candidate layouts with the same search (reshard_cost).
#include "tessel/sharding/reshard_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

// ---------------------------------------------------------------- printing

std::string ReshardStep::name() const {
  switch (kind) {
    case Kind::slice: return "slice";
    case Kind::to_partial: return "to_partial";
    case Kind::all_gather: return "all_gather";
    case Kind::all_to_all: return "all_to_all";
    case Kind::all_reduce: return "all_reduce";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::send_recv: return "send_recv";
  }
  return "?";
}

int64_t ReshardPlan::bytes_for(int64_t rank) const {
  int64_t n = 0;
  for (const ReshardStep& s : steps) {
    auto it = s.bytes.find(rank);
    if (it != s.bytes.end()) n += it->second;
  }
  return n;
}

int64_t ReshardPlan::max_bytes() const {
  std::map<int64_t, int64_t> per;
  for (const ReshardStep& s : steps)
    for (const auto& [r, b] : s.bytes) per[r] += b;
  int64_t m = 0;
  for (const auto& [r, b] : per) m = std::max(m, b);
  return m;
}

std::string ReshardPlan::str() const {
  std::string out = fmt::format("reshard {} {} : {} -> {}\n", dtype, shape_str(shape), src.str(), dst.str());
  if (steps.empty()) return out + "  (no steps: the layouts are the same)\n";
  for (const ReshardStep& s : steps) {
    const ProcessMesh& mesh = s.dst_mesh ? dst.mesh : src.mesh;
    std::string where = s.mesh_dim >= 0
                            ? fmt::format("mesh dim {} '{}' ({} ranks)", s.mesh_dim, mesh.dim_names()[static_cast<size_t>(s.mesh_dim)],
                                          mesh.dim_size(s.mesh_dim))
                            : fmt::format("{} -> {}", src.mesh.str(), dst.mesh.str());
    std::string dims;
    if (s.kind == ReshardStep::Kind::all_to_all) dims = fmt::format(", tensor dim {} -> {}", s.tensor_dim, s.tensor_dim2);
    else if (s.tensor_dim >= 0) dims = fmt::format(", tensor dim {}", s.tensor_dim);
    if (s.kind == ReshardStep::Kind::all_reduce || s.kind == ReshardStep::Kind::reduce_scatter)
      dims += fmt::format(", {}", s.reduce);
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const auto& [r, b] : s.bytes) {
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
    std::string bytes = !s.communicates() ? "no communication"
                        : s.bytes.empty() ? "0 B"
                        : lo == hi         ? fmt::format("{} B per rank", hi)
                                           : fmt::format("{}-{} B per rank", lo, hi);
    if (s.kind == ReshardStep::Kind::send_recv)
      out += fmt::format("  {} on {}: {}\n", s.name(), where, bytes);
    else
      out += fmt::format("  {} on {}{}: {} -> {}, {}\n", s.name(), where, dims, placements_str(s.before),
                         placements_str(s.after), bytes);
  }
  out += fmt::format("  total: {} B for the busiest rank\n", max_bytes());
  return out;
}

// ---------------------------------------------------------------- pieces

// An element's owner among replicas: the rank at coordinate 0 of every replicated mesh dim.
bool owns(const DistAttr& a, int64_t rank) {
  if (!a.mesh.contains(rank)) return false;
  std::vector<int64_t> c = a.mesh.coord(rank);
  for (size_t m = 0; m < a.placements.size(); ++m)
    if (a.placements[m].is_replicate() && c[m] != 0) return false;
  return true;
}

PieceBox box_of(const DistAttr& a, const Shape& shape, int64_t rank) { return PieceBox{a.local_offset(shape, rank), a.local_shape(shape, rank)}; }

PieceBox intersect(const PieceBox& a, const PieceBox& b) {
  PieceBox r;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    r.offset.push_back(lo);
    r.shape.push_back(std::max<int64_t>(0, hi - lo));
  }
  return r;
}

// ---------------------------------------------------------------- planning

namespace {

bool shards_after(const Placements& p, int64_t m, int64_t d) {
  for (size_t i = static_cast<size_t>(m) + 1; i < p.size(); ++i)
    if (p[i].is_shard(d)) return true;
  return false;
}

// The move of one mesh dim from cur to q, or nullopt when illegal. cur_later / q_later: a later
// mesh dim shards cur's / q's tensor dim (a shard may leave or join a mesh dim only when none
// does).
std::optional<ReshardStep::Kind> move_between(const Placement& cur, const Placement& q, bool cur_later, bool q_later) {
  if (cur == q) return std::nullopt;
  if (cur.is_shard() && cur_later) return std::nullopt;
  if (q.is_shard() && q_later) return std::nullopt;
  using K = ReshardStep::Kind;
  if (cur.is_replicate()) return q.is_shard() ? K::slice : K::to_partial;
  if (cur.is_shard()) {
    if (q.is_replicate()) return K::all_gather;
    if (q.is_shard()) return K::all_to_all;
    return K::to_partial;
  }
  // Partial
  if (q.is_replicate()) return K::all_reduce;
  if (q.is_shard()) return K::reduce_scatter;
  return std::nullopt;  // Partial -> another Partial goes through Replicate
}

// The move of mesh dim m from p[m] to q, or nullopt when illegal.
std::optional<ReshardStep::Kind> move_kind(const Placements& p, int64_t m, const Placement& q) {
  const Placement& cur = p[static_cast<size_t>(m)];
  return move_between(cur, q, cur.is_shard() && shards_after(p, m, cur.dim), q.is_shard() && shards_after(p, m, q.dim));
}

// The bytes mesh dim m's group holds of a tensor of `numel` elements laid out as p: the
// tensor divided by the other mesh dims' shards. size(i) is mesh dim i's size.
template <typename Size>
double held_bytes(const Placements& p, int64_t m, const Size& size, int64_t numel, DType dtype) {
  double held = static_cast<double>(numel);
  for (size_t i = 0; i < p.size(); ++i)
    if (static_cast<int64_t>(i) != m && p[i].is_shard()) held /= static_cast<double>(size(static_cast<int64_t>(i)));
  return static_cast<double>(static_cast<size_t>(std::ceil(held)) * dtype_size(dtype));
}

// The price of a legal move of one mesh dim (k ranks, `bytes` held along it) from cur to q:
// the bytes it moves and a collective's latency, in byte-equivalents; a local step (a slice,
// a switch to Partial) is nearly free.
double step_price(double bytes, const Placement& cur, const Placement& q, int64_t k) {
  const bool local = cur.is_replicate() || (cur.is_shard() && q.is_partial());
  return spmd::transition_cost(bytes, cur, q, k) + (!local && k > 1 ? 4096.0 : 1e-3);
}

// `numel`: the tensor's elements (shape_numel of its shape).
double move_cost(const Placements& p, int64_t m, const Placement& q, const DistAttr& attr, int64_t numel, DType dtype) {
  const auto size = [&](int64_t i) { return attr.mesh.dim_size(i); };
  return step_price(held_bytes(p, m, size, numel, dtype), p[static_cast<size_t>(m)], q, attr.mesh.dim_size(m));
}

void fill_bytes(ReshardStep& s, const ProcessMesh& mesh, const Shape& shape, DType dtype) {
  if (!s.communicates() || mesh.dim_size(s.mesh_dim) == 1) {
    if (s.communicates())
      for (int64_t r : mesh.process_ids()) s.bytes[r] = 0;
    return;
  }
  DistAttr before(mesh, s.before);
  for (int64_t r : mesh.process_ids())
    s.bytes[r] = shape_numel(before.local_shape(shape, r)) * static_cast<int64_t>(dtype_size(dtype));
}

// Cheapest move sequences on src's mesh from src's placements (Dijkstra over placement lists,
// keyed by placements_str). Stops once `goal` is settled; without one it settles every list
// reachable through R, S(d) and src's own Partial kinds.
struct Moves {
  std::map<std::string, double> cost;
  std::map<std::string, std::pair<std::string, ReshardStep>> came_from;
  std::map<std::string, Placements> lists;
};

Moves search_moves(const DistAttr& src, const Placements* goal, const Shape& shape, DType dtype) {
  const int64_t M = src.mesh.ndim();
  // Candidate placements for any mesh dim: R, S(d) for every tensor dim, and the Partial kinds
  // of the two ends.
  std::vector<Placement> options{Replicate()};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) options.push_back(Shard(d));
  for (const Placements* ps : {&src.placements, goal})
    if (ps != nullptr)
      for (const Placement& p : *ps)
        if (p.is_partial() && std::find(options.begin(), options.end(), p) == options.end()) options.push_back(p);

  auto key = [](const Placements& p) { return placements_str(p); };
  Moves mv;
  using Item = std::pair<double, std::string>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> open;
  mv.cost[key(src.placements)] = 0;
  mv.lists[key(src.placements)] = src.placements;
  open.push({0, key(src.placements)});
  const std::string goal_key = goal != nullptr ? key(*goal) : "";
  while (!open.empty()) {
    auto [d, k] = open.top();
    open.pop();
    if (d > mv.cost[k]) continue;
    if (k == goal_key) break;
    const Placements p = mv.lists[k];
    for (int64_t m = 0; m < M; ++m)
      for (const Placement& q : options) {
        auto kind = move_kind(p, m, q);
        if (!kind) continue;
        Placements next = p;
        next[static_cast<size_t>(m)] = q;
        double nd = d + move_cost(p, m, q, src, shape_numel(shape), dtype);
        std::string nk = key(next);
        auto it = mv.cost.find(nk);
        if (it != mv.cost.end() && it->second <= nd) continue;
        mv.cost[nk] = nd;
        mv.lists[nk] = next;
        ReshardStep step{.kind = *kind, .mesh_dim = m, .before = Placements(p.begin(), p.end()),
                         .after = Placements(next.begin(), next.end())};
        const Placement& cur = p[static_cast<size_t>(m)];
        step.tensor_dim = cur.is_shard() ? cur.dim : (q.is_shard() ? q.dim : -1);
        if (step.kind == ReshardStep::Kind::all_to_all) step.tensor_dim2 = q.dim;
        if (step.kind == ReshardStep::Kind::reduce_scatter) step.tensor_dim = q.dim;
        step.reduce = cur.is_partial() ? cur.reduce : (q.is_partial() ? q.reduce : ReduceOp::sum);
        mv.came_from[nk] = {k, step};
        open.push({nd, nk});
      }
  }
  return mv;
}

// The steps of `mv` from src's placements to `goal` (settled), with their bytes.
std::vector<ReshardStep> steps_to(const Moves& mv, const DistAttr& src, const Placements& goal, const Shape& shape,
                                  DType dtype) {
  std::vector<ReshardStep> steps;
  const std::string start = placements_str(src.placements);
  for (std::string k = placements_str(goal); k != start; k = mv.came_from.at(k).first)
    steps.push_back(mv.came_from.at(k).second);
  std::reverse(steps.begin(), steps.end());
  for (ReshardStep& s : steps) fill_bytes(s, src.mesh, shape, dtype);
  return steps;
}

Placements drop_partial(const Placements& p) {
  Placements out = p;
  for (Placement& x : out)
    if (x.is_partial()) x = Replicate();
  return out;
}

// The send_recv that hands every owned piece of `from` to the ranks of `to` that need it, with
// the bytes each source rank sends.
ReshardStep pieces_to(const DistAttr& from, const DistAttr& to, const Shape& shape, DType dtype) {
  ReshardStep xfer;
  xfer.kind = ReshardStep::Kind::send_recv;
  xfer.before = from.placements;
  xfer.after = to.placements;
  for (int64_t s : from.mesh.process_ids()) {
    if (!owns(from, s)) continue;
    PieceBox own = box_of(from, shape, s);
    int64_t sent = 0;
    for (int64_t d : to.mesh.process_ids()) {
      if (d == s) continue;
      sent += shape_numel(intersect(own, box_of(to, shape, d)).shape) * static_cast<int64_t>(dtype_size(dtype));
    }
    xfer.bytes[s] = sent;
  }
  return xfer;
}

}  // namespace

namespace {

constexpr int64_t kMaxTableStates = 1 << 16;

// The cheapest cost from one source to every placement list over R, S(d) and the source's
// Partial kinds: the same moves and prices as search_moves, with lists numbered (one digit
// per mesh dim, base = the options) so the search runs on arrays. Rules price many targets
// from each input's layout; one table answers them all. The search runs only as far as the
// targets asked so far: a query settles lists in Dijkstra's order until its own is settled,
// and the next query goes on from there — the same pops in the same order as one search to
// the end, so every answer is the value a whole search gives, while a table asked about a few
// lists near its source never expands the other thousands.
class CostTable {
 public:
  // nullptr when the lists are too many for a table (plan_reshard answers those).
  static std::shared_ptr<CostTable> make(const DistAttr& src, int64_t rank, int64_t numel, DType dtype) {
    auto t = std::shared_ptr<CostTable>(new CostTable());
    const int64_t M = src.mesh.ndim();
    t->options_.push_back(Replicate());
    for (int64_t d = 0; d < rank; ++d) t->options_.push_back(Shard(d));
    for (const Placement& p : src.placements)
      if (p.is_partial() && std::find(t->options_.begin(), t->options_.end(), p) == t->options_.end())
        t->options_.push_back(p);
    const int64_t B = static_cast<int64_t>(t->options_.size());
    int64_t states = 1;
    for (int64_t m = 0; m < M; ++m) {
      states *= B;
      if (states > kMaxTableStates) return nullptr;
    }
    for (int64_t m = 0; m < M; ++m) t->size_.push_back(src.mesh.dim_size(m));
    t->numel_ = numel;
    t->dtype_ = dtype;
    t->rank_ = rank;
    t->cost_.assign(static_cast<size_t>(states), std::numeric_limits<double>::infinity());
    t->settled_.assign(static_cast<size_t>(states), 0);
    const int64_t start = t->code(src.placements);
    t->cost_[static_cast<size_t>(start)] = 0;
    t->open_.push({0, start});
    return t;
  }

  // The list's code, or -1 when it holds a placement the table has no option for.
  int64_t code(const Placements& p) const {
    int64_t c = 0;
    for (size_t m = p.size(); m-- > 0;) {
      auto it = std::find(options_.begin(), options_.end(), p[m]);
      if (it == options_.end()) return -1;
      c = c * static_cast<int64_t>(options_.size()) + (it - options_.begin());
    }
    return c;
  }

  // The cheapest cost to the list `c` (infinity where unreachable). Thread-safe.
  double cost(int64_t c) {
    std::lock_guard lock(mutex_);
    while (settled_[static_cast<size_t>(c)] == 0 && !open_.empty()) settle_next();
    return cost_[static_cast<size_t>(c)];
  }

 private:
  CostTable() = default;

  // Pops the cheapest open list and relaxes its moves — move_kind's and move_cost's, with the
  // last mesh dim sharding each tensor dim worked out once per list rather than once per move.
  void settle_next() {
    const auto [d, k] = open_.top();
    open_.pop();
    if (d > cost_[static_cast<size_t>(k)]) return;  // superseded
    settled_[static_cast<size_t>(k)] = 1;
    const auto M = static_cast<int64_t>(size_.size());
    const auto B = static_cast<int64_t>(options_.size());
    Placements& p = scratch_;
    p.resize(static_cast<size_t>(M));
    last_.assign(static_cast<size_t>(rank_), -1);
    for (int64_t m = 0, x = k; m < M; ++m, x /= B) {
      const Placement& at = p[static_cast<size_t>(m)] = options_[static_cast<size_t>(x % B)];
      if (at.is_shard()) last_[static_cast<size_t>(at.dim)] = m;
    }
    const auto size = [&](int64_t i) { return size_[static_cast<size_t>(i)]; };
    int64_t place = 1;
    for (int64_t m = 0; m < M; ++m, place *= B) {
      const int64_t digit = (k / place) % B;
      const Placement& cur = p[static_cast<size_t>(m)];
      const auto later = [&](const Placement& x) { return x.is_shard() && last_[static_cast<size_t>(x.dim)] > m; };
      const bool cur_later = later(cur);
      const double bytes = held_bytes(p, m, size, numel_, dtype_);
      for (int64_t j = 0; j < B; ++j) {
        if (j == digit) continue;  // the options are distinct: j == digit is no move
        const Placement& q = options_[static_cast<size_t>(j)];
        if (!move_between(cur, q, cur_later, later(q))) continue;
        const double nd = d + step_price(bytes, cur, q, size(m));
        const int64_t nk = k + (j - digit) * place;
        if (cost_[static_cast<size_t>(nk)] <= nd) continue;
        cost_[static_cast<size_t>(nk)] = nd;
        open_.push({nd, nk});
      }
    }
  }

  std::vector<Placement> options_;
  std::vector<int64_t> size_;  // the mesh's dim sizes
  int64_t numel_ = 0, rank_ = 0;
  DType dtype_ = DType::f32;
  std::mutex mutex_;
  std::vector<double> cost_;      // by code; infinity where not reached yet
  std::vector<uint8_t> settled_;  // cost_ is final
  using Item = std::pair<double, int64_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> open_;
  Placements scratch_;
  std::vector<int64_t> last_;
};

// What a table depends on, packed in integers: the mesh's shape (not its ranks), the source's
// placements, the tensor's rank and element count, the dtype.
struct TableKey {
  std::vector<int64_t> words;
  bool operator==(const TableKey& o) const { return words == o.words; }
};
struct TableKeyHash {
  size_t operator()(const TableKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t w : k.words) h = (h ^ static_cast<uint64_t>(w)) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};
TableKey table_key(const DistAttr& src, int64_t rank, int64_t numel, DType dtype) {
  TableKey k;
  const Shape& mesh = src.mesh.shape();
  k.words.reserve(mesh.size() + src.placements.size() + 4);
  k.words.push_back(static_cast<int64_t>(mesh.size()));
  k.words.insert(k.words.end(), mesh.begin(), mesh.end());
  for (const Placement& p : src.placements)
    k.words.push_back(p.is_shard() ? 1 + p.dim : p.is_partial() ? -1 - static_cast<int64_t>(p.reduce) : 0);
  k.words.push_back(rank);
  k.words.push_back(numel);
  k.words.push_back(static_cast<int64_t>(dtype));
  return k;
}

}  // namespace

double reshard_cost(const DistAttr& src, const Placements& dst, const Shape& shape, DType dtype) {
  if (src.placements == dst) return 0;
  // Tables per source, shared by every thread (a table depends on the mesh's shape, not on
  // its ranks: the planner's traced steps, each on a thread of its own, reuse them) and
  // bounded: a long run with many shapes clears them now and then.
  static std::mutex mutex;
  static std::unordered_map<TableKey, std::shared_ptr<CostTable>, TableKeyHash> tables;
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t numel = shape_numel(shape);
  TableKey key = table_key(src, rank, numel, dtype);
  std::shared_ptr<CostTable> table;
  {
    std::lock_guard lock(mutex);
    if (auto it = tables.find(key); it != tables.end()) table = it->second;
  }
  if (!table) {
    src.check(shape, "reshard source");
    std::shared_ptr<CostTable> made = CostTable::make(src, rank, numel, dtype);
    std::lock_guard lock(mutex);
    if (tables.size() > 20'000) tables.clear();
    table = tables.emplace(std::move(key), std::move(made)).first->second;
  }
  CostTable* t = table.get();
  const int64_t code = t != nullptr ? t->code(dst) : -1;
  if (code >= 0) {
    const double c = t->cost(code);
    TESSEL_CHECK(c < std::numeric_limits<double>::infinity(), "reshard: no plan from {} to {} for shape {}", src.str(),
                 placements_str(dst), shape_str(shape));
    return c;
  }
  // A destination with a Partial kind the source lacks (or a mesh too large for a table).
  return plan_reshard(src, DistAttr(src.mesh, dst), shape, dtype).cost;
}

ReshardPlan plan_reshard(const DistAttr& src, const DistAttr& dst, const Shape& shape, DType dtype) {
  src.check(shape, "reshard source");
  dst.check(shape, "reshard destination");
  ReshardPlan plan{src, dst, shape, dtype, {}, 0};
  if (src.mesh == dst.mesh) {
    Moves mv = search_moves(src, &dst.placements, shape, dtype);
    auto it = mv.cost.find(placements_str(dst.placements));
    TESSEL_CHECK(it != mv.cost.end(), "reshard: no plan from {} to {} for shape {}", src.str(),
                 placements_str(dst.placements), shape_str(shape));
    plan.cost = it->second;
    plan.steps = steps_to(mv, src, dst.placements, shape, dtype);
    return plan;
  }
  // 1. On the source mesh, to the layout the pieces leave from: no Partial, and the cheapest
  // of them counting the move that follows (a Partial reduce-scattered rather than all-reduced,
  // or a replicated dim sliced so that every replica sends a part). Ties keep the list that
  // only drops Partial, then the first by name.
  Moves mv = search_moves(src, nullptr, shape, dtype);
  DistAttr to(dst.mesh, drop_partial(dst.placements));
  std::vector<Placements> leaving{drop_partial(src.placements)};
  for (const auto& [k, p] : mv.lists)
    if (std::none_of(p.begin(), p.end(), [](const Placement& x) { return x.is_partial(); }) && p != leaving.front())
      leaving.push_back(p);
  double best = std::numeric_limits<double>::infinity();
  Placements mid;
  ReshardStep xfer;
  for (const Placements& p : leaving) {
    ReshardStep move = pieces_to(DistAttr(src.mesh, p), to, shape, dtype);
    double moved = 0;
    for (const auto& [rank, bytes] : move.bytes) moved = std::max(moved, static_cast<double>(bytes));
    const double total = mv.cost.at(placements_str(p)) + moved;
    if (total >= best) continue;
    best = total;
    mid = p;
    xfer = std::move(move);
  }
  plan.steps = steps_to(mv, src, mid, shape, dtype);
  // 2. The pieces to the destination ranks that need them.
  plan.steps.push_back(xfer);
  // 3. Partial destinations are made locally.
  Placements cur = to.placements;
  for (size_t m = 0; m < dst.placements.size(); ++m)
    if (dst.placements[m].is_partial()) {
      ReshardStep s;
      s.kind = ReshardStep::Kind::to_partial;
      s.mesh_dim = static_cast<int64_t>(m);
      s.dst_mesh = true;
      s.before = cur;
      cur[m] = dst.placements[m];
      s.after = cur;
      s.reduce = dst.placements[m].reduce;
      plan.steps.push_back(s);
    }
  plan.cost = best;
  return plan;
}

}  // namespace tessel
