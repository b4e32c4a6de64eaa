// The label strategy engine and the common rule shapes.
#include "tessel/sharding/spmd_rules.h"

#include <algorithm>
#include <limits>

#include "tessel/core/error.h"

namespace tessel::spmd {

double transition_cost(const TensorMeta& meta, const Placement& from, const Placement& to, int64_t k) {
  if (from == to || k <= 1) return 0;
  const double bytes = static_cast<double>(meta.nbytes());
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

namespace {

bool partial_linear_kind(ReduceOp op) { return op == ReduceOp::sum || op == ReduceOp::avg; }

}  // namespace

SpmdDecision label_rule(const SpmdCall& c, const LabelRule& rule) {
  const size_t n = rule.inputs.size();
  const int64_t M = c.mesh_ndim();
  SpmdDecision d;
  d.inputs.assign(n, Placements(static_cast<size_t>(M), Replicate()));
  d.outputs.assign(1, Placements(static_cast<size_t>(M), Replicate()));
  // Labels in order of first appearance.
  std::string labels;
  for (const std::string& l : rule.inputs)
    for (char ch : l)
      if (ch != '.' && labels.find(ch) == std::string::npos) labels += ch;

  // Per mesh dim, the cheapest of: keep Partial inputs Partial (linear ops), shard one label,
  // replicate everything. Candidates are scored without materialising them (this runs on every
  // distributed op call).
  constexpr int kPartial = -2, kReplicate = -1;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t k = c.mesh().dim_size(m);
    auto current = [&](size_t i) -> const Placement& { return c.input_attrs[i].placements[static_cast<size_t>(m)]; };
    auto label_placement = [&](size_t i, char L) {
      size_t pos = rule.inputs[i].find(L);
      return pos == std::string::npos ? Replicate() : Shard(static_cast<int64_t>(pos));
    };
    // Partial passthrough is allowed when the partial inputs share a linear kind and the op's
    // linearity admits their number and position.
    size_t n_partial = 0, first_partial = n;
    for (size_t i = 0; i < n; ++i)
      if (current(i).is_partial()) {
        if (n_partial++ == 0) first_partial = i;
      }
    bool passthrough = false;
    ReduceOp kind = ReduceOp::sum;
    if (n_partial > 0) {
      kind = current(first_partial).reduce;
      passthrough = partial_linear_kind(kind);
      for (size_t i = 0; i < n; ++i) passthrough = passthrough && (!current(i).is_partial() || current(i).reduce == kind);
      switch (rule.linearity) {
        case Linearity::none: passthrough = false; break;
        case Linearity::joint: passthrough = passthrough && n_partial == n; break;
        case Linearity::single: passthrough = passthrough && n_partial == 1; break;
        case Linearity::first: passthrough = passthrough && n_partial == 1 && first_partial == 0; break;
      }
    }
    auto input_for = [&](int choice, size_t i) -> Placement {
      if (choice == kPartial) return current(i).is_partial() ? current(i) : Replicate();
      if (choice == kReplicate) return Replicate();
      return label_placement(i, labels[static_cast<size_t>(choice)]);
    };
    auto cost = [&](int choice) {
      double total = 0;
      for (size_t i = 0; i < n; ++i) total += transition_cost(c.inputs[i], current(i), input_for(choice, i), k);
      return total;
    };
    // Ties (common on mesh dims of size 1, where every move is free) go to the choice that
    // changes fewest input placements: no reshard at all when the inputs already fit.
    auto changes = [&](int choice) {
      int count = 0;
      for (size_t i = 0; i < n; ++i) count += input_for(choice, i) == current(i) ? 0 : 1;
      return count;
    };
    int best = kReplicate, best_changes = std::numeric_limits<int>::max();
    double best_cost = std::numeric_limits<double>::infinity();
    auto consider = [&](int choice) {
      const double v = cost(choice);
      if (v > best_cost) return;
      const int ch = changes(choice);
      if (v < best_cost || ch < best_changes) best = choice, best_cost = v, best_changes = ch;
    };
    if (passthrough) consider(kPartial);
    for (size_t l = 0; l < labels.size(); ++l) consider(static_cast<int>(l));
    consider(kReplicate);
    for (size_t i = 0; i < n; ++i) d.inputs[i][static_cast<size_t>(m)] = input_for(best, i);
    Placement out = Replicate();
    if (best == kPartial) out = Partial(kind);
    else if (best >= 0) {
      size_t opos = rule.output.find(labels[static_cast<size_t>(best)]);
      out = opos == std::string::npos ? Partial(rule.contracted) : Shard(static_cast<int64_t>(opos));
    }
    d.outputs[0][static_cast<size_t>(m)] = out;
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
