// The label strategy engine and the common rule shapes.
#include "tessel/sharding/spmd_rules.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/sharding/reshard_plan.h"

namespace tessel {

SpmdAudit*& spmd_audit() {
  thread_local SpmdAudit* audit = nullptr;
  return audit;
}

}  // namespace tessel

namespace tessel::spmd {

double transition_cost(const TensorMeta& meta, const Placement& from, const Placement& to, int64_t k) {
  return transition_cost(static_cast<double>(meta.nbytes()), from, to, k);
}

double transition_cost(double bytes, const Placement& from, const Placement& to, int64_t k) {
  if (from == to || k <= 1) return 0;
  const double ring = static_cast<double>(k - 1) / static_cast<double>(k);
  if (from.is_partial()) {
    if (to.is_replicate()) return 2 * ring * bytes;  // all_reduce
    if (to.is_shard()) return ring * bytes;          // reduce_scatter
    return 2 * ring * bytes;                          // via replicate
  }
  if (from.is_shard()) {
    if (to.is_replicate()) return ring * bytes;           // all_gather
    if (to.is_shard()) return ring * bytes / k;           // all_to_all of the local piece
    return 0;                                             // zero-pad into a Partial
  }
  return 0;  // from replicate: local slice or local Partial
}

Placements replicated(const SpmdCall& c) { return Placements(static_cast<size_t>(c.mesh_ndim()), Replicate()); }

Placements without(const Placements& p, const std::vector<int64_t>& dims, bool drop_partial) {
  Placements out = p;
  for (Placement& x : out)
    if ((x.is_shard() && std::find(dims.begin(), dims.end(), x.dim) != dims.end()) || (drop_partial && x.is_partial()))
      x = Replicate();
  return out;
}

std::string inputs_str(const SpmdCall& c) {
  std::string out;
  for (size_t i = 0; i < c.input_attrs.size(); ++i)
    out += fmt::format("{}{} {}", i ? ", " : "", c.inputs[i].str(), placements_str(c.input_attrs[i].placements));
  return out + " on " + c.mesh().str();
}

double owed_reduction_cost(const ProcessMesh& mesh, const Placements& out, const TensorMeta& meta) {
  if (std::none_of(out.begin(), out.end(), [](const Placement& p) { return p.is_partial(); })) return 0;
  // Half the planner's price of reducing to Replicate: the reduce_scatter a Partial owes at
  // least. The all_gather half is what a sharded output owes too, and neither is charged.
  return 0.5 * reshard_cost(DistAttr(mesh, out), without(out, {}, true), meta.shape, meta.dtype);
}

namespace {

bool partial_linear_kind(ReduceOp op) { return op == ReduceOp::sum || op == ReduceOp::avg; }

// One mesh dim's part of a candidate layout.
struct Choice {
  enum Kind : uint8_t { partial_all, keep_one, label, replicate } kind;
  int arg = 0;  // keep_one: the input kept Partial; label: the label's index
};

// Costs by placement list, within one rule's search. A list packs into one word (a byte per
// mesh dim) when it has at most 8 mesh dims and tensor dims below 64; others are priced each
// time.
class CostMemo {
 public:
  template <typename F>
  double get(const Placements& p, F&& price) {
    uint64_t key = 0;
    if (!pack(p, key)) return price();
    auto [it, fresh] = costs_.try_emplace(key, 0.0);
    if (fresh) it->second = price();
    return it->second;
  }

 private:
  static bool pack(const Placements& p, uint64_t& key) {
    if (p.size() > 8) return false;
    for (const Placement& x : p) {
      uint64_t b = 0;
      if (x.is_shard()) {
        if (x.dim < 0 || x.dim >= 64) return false;
        b = 64 + static_cast<uint64_t>(x.dim);
      } else if (x.is_partial()) {
        b = 128 + static_cast<uint64_t>(x.reduce);
        if (b > 255) return false;
      } else {
        b = 1;
      }
      key = key << 8 | b;
    }
    return true;
  }
  std::unordered_map<uint64_t, double> costs_;
};

// Above this many joint candidates, labels no input shards yet are dropped from each mesh dim's
// choices (a layout sharding them costs at least a slice more than one that does not, and
// seldom wins); the rest are enumerated in full.
constexpr size_t kMaxCandidates = 4096;

}  // namespace

SpmdDecision label_rule(const SpmdCall& c, const LabelRule& rule) {
  const size_t n = rule.inputs.size();
  const int64_t M = c.mesh_ndim();
  const ProcessMesh& mesh = c.mesh();
  SpmdAudit* audit = spmd_audit();
  TESSEL_CHECK(rule.owed_scale >= 0, "spmd rule of {}: owed_scale {} is negative", c.op, rule.owed_scale);

  // Decisions are values of (labels, shapes, placements, mesh dims): cached per thread, since
  // this runs on every distributed op call and a training step repeats its calls.
  thread_local std::unordered_map<std::string, SpmdDecision> cache;
  std::string key;
  if (audit == nullptr) {
    key = fmt::format("{}>{}|{}|{}|{}|{}", fmt::join(rule.inputs, ","), rule.output, static_cast<int>(rule.linearity),
                      static_cast<int>(rule.contracted), rule.owed_scale, fmt::join(mesh.shape(), "x"));
    for (size_t i = 0; i < n; ++i)
      key += fmt::format("|{}{}{}{}", c.inputs[i].dtype, shape_str(c.inputs[i].shape), placements_str(c.input_attrs[i].placements),
                         i < 64 && (c.params >> i & 1u) ? "p" : "");
    if (!rule.output_shape.empty()) key += "|out" + shape_str(rule.output_shape);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }

  // Labels in order of first appearance, with their sizes.
  std::string labels;
  std::vector<int64_t> label_size;
  for (size_t i = 0; i < n; ++i)
    for (size_t d = 0; d < rule.inputs[i].size(); ++d) {
      char ch = rule.inputs[i][d];
      if (ch != '.' && labels.find(ch) == std::string::npos) {
        labels += ch;
        label_size.push_back(d < c.inputs[i].shape.size() ? c.inputs[i].shape[d] : 1);
      }
    }
  // The output's meta as far as the labels tell: a '.' dim is input 0's at the same place when
  // the ranks agree (a kept whole dim), else 1 (a broadcast or kept reduced dim).
  TensorMeta out_meta{{}, n > 0 ? c.inputs[0].dtype : DType::f32, {}};
  for (size_t d = 0; d < rule.output.size(); ++d) {
    size_t l = labels.find(rule.output[d]);
    out_meta.shape.push_back(l != std::string::npos ? label_size[l]
                             : n > 0 && rule.output.size() == c.inputs[0].shape.size() ? c.inputs[0].shape[d]
                                                                                       : 1);
  }
  if (!rule.output_shape.empty()) out_meta.shape = rule.output_shape;
  auto current = [&](size_t i, int64_t m) -> const Placement& { return c.input_attrs[i].placements[static_cast<size_t>(m)]; };

  // Each mesh dim's choices, in tie order: keep Partial inputs Partial (linear ops), shard one
  // label, replicate everything.
  std::vector<std::vector<Choice>> choices(static_cast<size_t>(M));
  std::vector<bool> live(labels.size(), false);  // labels some input shards now
  for (size_t i = 0; i < n; ++i)
    for (const Placement& p : c.input_attrs[i].placements)
      if (p.is_shard() && p.dim < static_cast<int64_t>(rule.inputs[i].size()) && rule.inputs[i][static_cast<size_t>(p.dim)] != '.')
        live[labels.find(rule.inputs[i][static_cast<size_t>(p.dim)])] = true;
  size_t total = 1;
  for (int64_t m = 0; m < M; ++m) {
    std::vector<Choice>& ch = choices[static_cast<size_t>(m)];
    std::vector<size_t> partial;  // inputs Partial of a linear kind on this mesh dim
    bool all_same = true;
    for (size_t i = 0; i < n; ++i)
      if (current(i, m).is_partial()) {
        if (partial_linear_kind(current(i, m).reduce)) partial.push_back(i);
        all_same = all_same && current(i, m).reduce == current(0, m).reduce;
      }
    switch (rule.linearity) {
      case Linearity::none: break;
      case Linearity::joint:
        if (partial.size() == n && all_same) ch.push_back({Choice::partial_all, 0});
        break;
      case Linearity::single:
        // One input stays Partial, the others are reduced: with several Partial inputs, each
        // is a candidate for the one kept.
        for (size_t i : partial) ch.push_back({Choice::keep_one, static_cast<int>(i)});
        break;
      case Linearity::first:
        if (!partial.empty() && partial.front() == 0) ch.push_back({Choice::keep_one, 0});
        break;
    }
    // A label shorter than the mesh dim (a batch of one over two ranks) would leave ranks with
    // empty pieces and the rest with all the work: not offered, unless an input is sharded so
    // on this mesh dim already (keeping it costs no move).
    for (size_t l = 0; l < labels.size(); ++l) {
      bool held = false;
      for (size_t i = 0; i < n && !held; ++i) {
        const Placement& p = current(i, m);
        held = p.is_shard() && p.dim < static_cast<int64_t>(rule.inputs[i].size()) &&
               rule.inputs[i][static_cast<size_t>(p.dim)] == labels[l];
      }
      if (label_size[l] < mesh.dim_size(m) && !held) continue;
      ch.push_back({Choice::label, static_cast<int>(l)});
    }
    ch.push_back({Choice::replicate, 0});
    total *= ch.size();
  }
  if (total > kMaxCandidates) {
    total = 1;
    for (std::vector<Choice>& ch : choices) {
      std::erase_if(ch, [&](const Choice& x) { return x.kind == Choice::label && !live[static_cast<size_t>(x.arg)]; });
      total *= ch.size();
    }
  }

  auto input_for = [&](const Choice& x, size_t i, int64_t m) -> Placement {
    switch (x.kind) {
      case Choice::partial_all: return current(i, m);
      case Choice::keep_one: return static_cast<int>(i) == x.arg ? current(i, m) : Replicate();
      case Choice::label: {
        size_t pos = rule.inputs[i].find(labels[static_cast<size_t>(x.arg)]);
        return pos == std::string::npos ? Replicate() : Shard(static_cast<int64_t>(pos));
      }
      case Choice::replicate: return Replicate();
    }
    return Replicate();
  };
  auto output_for = [&](const Choice& x, int64_t m) -> Placement {
    switch (x.kind) {
      case Choice::partial_all:
      case Choice::keep_one: return Partial(current(static_cast<size_t>(x.arg), m).reduce);
      case Choice::label: {
        size_t pos = rule.output.find(labels[static_cast<size_t>(x.arg)]);
        return pos == std::string::npos ? Partial(rule.contracted) : Shard(static_cast<int64_t>(pos));
      }
      case Choice::replicate: return Replicate();
    }
    return Replicate();
  };

  SpmdAudit::Entry entry;
  if (audit != nullptr) {
    entry.op = std::string(c.op);
    for (size_t i = 0; i < n; ++i) {
      entry.inputs.push_back(c.inputs[i]);
      entry.current.push_back(c.input_attrs[i].placements);
    }
    entry.output = out_meta;
    entry.owed_scale = rule.owed_scale;
  }
  // The candidates repeat each input's target layouts and the outputs many times over: each
  // cost is priced once per call.
  std::vector<CostMemo> input_costs(n);
  CostMemo owed_costs;
  std::vector<size_t> idx(static_cast<size_t>(M), 0);
  SpmdCandidate best;
  bool have_best = false;
  SpmdCandidate cand;
  cand.inputs.assign(n, Placements(static_cast<size_t>(M), Replicate()));
  cand.output.assign(static_cast<size_t>(M), Replicate());
  for (size_t t = 0; t < total; ++t) {
    for (int64_t m = 0; m < M; ++m) {
      const Choice& x = choices[static_cast<size_t>(m)][idx[static_cast<size_t>(m)]];
      for (size_t i = 0; i < n; ++i) cand.inputs[i][static_cast<size_t>(m)] = input_for(x, i, m);
      cand.output[static_cast<size_t>(m)] = output_for(x, m);
    }
    cand.input_cost = 0;
    cand.changes = 0;
    for (size_t i = 0; i < n; ++i) {
      cand.input_cost += input_costs[i].get(cand.inputs[i], [&] {
        return reshard_cost(c.input_attrs[i], cand.inputs[i], c.inputs[i].shape, c.inputs[i].dtype);
      });
      const int weight = i < 64 && (c.params >> i & 1u) ? 2 : 1;
      for (int64_t m = 0; m < M; ++m) cand.changes += cand.inputs[i][static_cast<size_t>(m)] == current(i, m) ? 0 : weight;
    }
    // Costs within a part in a billion are a tie: fewer changed placements win, then the
    // candidate enumerated first.
    const double tol = 1e-9 * std::max(1.0, have_best ? best.cost() : 0.0);
    // What the output owes only adds: a candidate whose inputs alone cost more than the best
    // so far cannot win, and its reductions (a search of their own) go unpriced — unless an
    // audit lists every candidate's costs.
    const bool lost = have_best && audit == nullptr && cand.input_cost > best.cost() + tol;
    if (!lost) {
      cand.owed_cost = rule.owed_scale *
                       owed_costs.get(cand.output, [&] { return owed_reduction_cost(mesh, cand.output, out_meta); });
      if (!have_best || cand.cost() < best.cost() - tol ||
          (cand.cost() <= best.cost() + tol && cand.changes < best.changes)) {
        best = cand;
        have_best = true;
        entry.chosen = entry.candidates.size();
      }
    }
    if (audit != nullptr) entry.candidates.push_back(cand);
    // Next combination (mesh dim M-1 fastest).
    for (int64_t m = M - 1; m >= 0; --m) {
      size_t& j = idx[static_cast<size_t>(m)];
      if (++j < choices[static_cast<size_t>(m)].size()) break;
      j = 0;
    }
  }
  SpmdDecision d;
  d.inputs = best.inputs;
  d.outputs = {best.output};
  if (audit != nullptr) audit->entries.push_back(std::move(entry));
  else {
    if (cache.size() > 100'000) cache.clear();
    cache.emplace(std::move(key), d);
  }
  return d;
}

LabelRule elementwise_labels(const SpmdCall& c, size_t n, Linearity linearity) {
  Shape out;
  for (size_t i = 0; i < n; ++i) out = i == 0 ? c.inputs[0].shape : broadcast_shapes(out, c.inputs[i].shape, c.op);
  LabelRule r;
  r.linearity = linearity;
  for (size_t d = 0; d < out.size(); ++d) r.output += out[d] == 1 ? '.' : static_cast<char>('a' + d);
  for (size_t i = 0; i < n; ++i) {
    const Shape& s = c.inputs[i].shape;
    std::string l;
    size_t lead = out.size() - s.size();
    for (size_t d = 0; d < s.size(); ++d) l += (s[d] == 1 && out[lead + d] != 1) ? '.' : r.output[lead + d];
    r.inputs.push_back(l);
  }
  return r;
}

SpmdDecision elementwise_rule(const SpmdCall& c, Linearity linearity) {
  return label_rule(c, elementwise_labels(c, c.inputs.size(), linearity));
}

std::string dim_labels(size_t n, char first) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += static_cast<char>(first + static_cast<char>(i));
  return out;
}

SpmdDecision keep_shape_rule(const SpmdCall& c, const std::vector<int64_t>& fixed, Linearity linearity) {
  LabelRule r;
  r.linearity = linearity;
  const Shape& s = c.inputs[0].shape;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d)
    r.output += std::find(fixed.begin(), fixed.end(), d) != fixed.end() ? '.' : static_cast<char>('a' + d);
  r.inputs.push_back(r.output);
  SpmdDecision dec = label_rule(c, r);
  for (size_t i = 1; i < c.inputs.size(); ++i) dec.inputs.push_back(replicated(c));
  return dec;
}

Shape keepdim_shape(const Shape& input, const std::vector<int64_t>& dims) {
  Shape out = input;
  for (int64_t d : dims) out[static_cast<size_t>(d)] = 1;
  return out;
}

SpmdDecision reduction_rule(const SpmdCall& c, const std::vector<int64_t>& dims, bool keepdim, ReduceOp partial) {
  LabelRule r;
  r.linearity = partial == ReduceOp::max || partial == ReduceOp::min ? Linearity::none : Linearity::single;
  r.contracted = partial;
  const Shape& s = c.inputs[0].shape;
  std::string in;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    char L = static_cast<char>('a' + d);
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    in += L;
    if (!reduced) r.output += L;
    else if (keepdim) r.output += '.';
  }
  r.inputs.push_back(in);
  if (keepdim) r.output_shape = keepdim_shape(s, dims);
  SpmdDecision dec = label_rule(c, r);
  // max of Partial(max) pieces is the max: pass it through (label_rule only passes sum/avg).
  if (partial == ReduceOp::max || partial == ReduceOp::min)
    for (int64_t m = 0; m < c.mesh_ndim(); ++m) {
      const Placement& cur = c.input_attrs[0].placements[static_cast<size_t>(m)];
      if (cur.is_partial() && cur.reduce == partial) {
        dec.inputs[0][static_cast<size_t>(m)] = cur;
        dec.outputs[0][static_cast<size_t>(m)] = cur;
      }
    }
  return dec;
}

}  // namespace tessel::spmd
