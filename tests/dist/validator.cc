// The rule validator's machinery (see validator.h).
#include "validator.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/reshard.h"

namespace tessel::testing {

Serial serial_run(const OpCase& c) {
  Serial s;
  s.inputs = c.make_inputs(DType::f64);
  Tensors leaves;
  for (const Tensor& t : s.inputs) {
    Tensor x = view::clone(t);
    if (is_floating(x.dtype())) x.set_requires_grad(true);
    leaves.push_back(x);
  }
  s.outputs = c.run(leaves);
  Tensor loss;
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    s.weights.push_back(is_floating(s.outputs[k].dtype()) ? rand_tensor(s.outputs[k].shape(), s.outputs[k].dtype(), 500 + k) : Tensor());
    if (!s.weights[k].defined() || !s.outputs[k].requires_grad()) continue;
    Tensor term = sum(mul(s.outputs[k], s.weights[k]));
    loss = loss.defined() ? add(loss, term) : term;
  }
  if (loss.defined()) backward(loss);
  for (const Tensor& l : leaves) s.grads.push_back(l.requires_grad() ? l.grad() : Tensor());
  return s;
}

std::vector<Placements> placement_lists(int64_t rank, bool floating, int64_t ndim) {
  std::vector<Placement> one{Replicate()};
  for (int64_t d = 0; d < rank; ++d) one.push_back(Shard(d));
  if (floating) one.push_back(Partial());
  std::vector<Placements> out{{}};
  for (int64_t m = 0; m < ndim; ++m) {
    std::vector<Placements> next;
    for (const Placements& p : out)
      for (const Placement& q : one) {
        Placements e = p;
        e.push_back(q);
        next.push_back(e);
      }
    out = next;
  }
  return out;
}

std::vector<std::vector<Placements>> combinations(const Tensors& inputs, int64_t ndim, size_t limit, uint64_t seed) {
  std::vector<std::vector<Placements>> per;
  size_t total = 1;
  for (const Tensor& t : inputs) {
    per.push_back(placement_lists(t.dim(), is_floating(t.dtype()), ndim));
    total *= per.back().size();
  }
  std::vector<std::vector<Placements>> out;
  auto decode = [&](uint64_t idx) {
    std::vector<Placements> combo;
    for (const auto& opts : per) {
      combo.push_back(opts[idx % opts.size()]);
      idx /= opts.size();
    }
    return combo;
  };
  if (total <= limit) {
    for (size_t i = 0; i < total; ++i) out.push_back(decode(i));
  } else {
    for (size_t i = 0; i < limit; ++i) out.push_back(decode(philox_at(seed, 1, i)[0] % total));
  }
  return out;
}

std::string combo_str(const std::vector<Placements>& combo) {
  std::string s;
  for (const Placements& p : combo) s += (s.empty() ? "" : " x ") + placements_str(p);
  return s;
}

std::string check_choices(const SpmdAudit& audit, const ProcessMesh& mesh) {
  for (const SpmdAudit::Entry& e : audit.entries) {
    // Each candidate priced again by the reshard planner itself, plan by plan.
    auto price = [&](const SpmdCandidate& cand) {
      double in = 0;
      for (size_t i = 0; i < e.inputs.size(); ++i)
        in += plan_reshard(DistAttr(mesh, e.current[i]), DistAttr(mesh, cand.inputs[i]), e.inputs[i].shape, e.inputs[i].dtype).cost;
      double owed = 0;
      if (std::any_of(cand.output.begin(), cand.output.end(), [](const Placement& p) { return p.is_partial(); })) {
        Placements reduced = cand.output;
        for (Placement& p : reduced)
          if (p.is_partial()) p = Replicate();
        owed = e.owed_scale * 0.5 *
               plan_reshard(DistAttr(mesh, cand.output), DistAttr(mesh, reduced), e.output.shape, e.output.dtype).cost;
      }
      return in + owed;
    };
    if (e.candidates.empty()) return fmt::format("rule of {} considered no candidate", e.op);
    const SpmdCandidate& chosen = e.candidates[e.chosen];
    const double chosen_cost = price(chosen);
    auto layout = [](const SpmdCandidate& x) {
      std::string s;
      for (const Placements& p : x.inputs) s += (s.empty() ? "" : " x ") + placements_str(p);
      return s + " -> " + placements_str(x.output);
    };
    for (const SpmdCandidate& cand : e.candidates) {
      const double v = price(cand);
      if (std::abs(v - cand.cost()) > 1e-6 * std::max(1.0, v))
        return fmt::format("rule of {}: candidate {} priced {} by the rule, {} by the planner", e.op, layout(cand), cand.cost(), v);
      if (v < chosen_cost - 1e-9 * std::max(1.0, chosen_cost))
        return fmt::format("rule of {} chose {} at {} over the cheaper {} at {}", e.op, layout(chosen), chosen_cost, layout(cand), v);
    }
  }
  return "";
}

std::vector<std::string> validate_on_rank(const OpCase& c, const Serial& s, const ProcessMesh& mesh,
                                          const std::vector<std::vector<Placements>>& combos, int rank) {
  std::vector<std::string> failures;
            for (const auto& combo : combos) {
              std::string where = fmt::format("{} [{}] on {}", c.name, combo_str(combo), mesh.str());
              std::string problem;
              try {
                Tensors dts;
                {
                  NoGradGuard g;
                  for (size_t i = 0; i < s.inputs.size(); ++i) dts.push_back(shard_tensor(s.inputs[i], mesh, combo[i]));
                }
                for (Tensor& t : dts)
                  if (is_floating(t.dtype())) t.set_requires_grad(true);
                // Rank 0 records what the rules weighed during the forward and checks it below.
                SpmdAudit audit;
                if (rank == 0) spmd_audit() = &audit;
                Tensors outs;
                try {
                  outs = c.run(dts);
                } catch (...) {
                  spmd_audit() = nullptr;
                  throw;
                }
                spmd_audit() = nullptr;
                problem = check_choices(audit, mesh);
                Tensor loss;
                for (size_t k = 0; k < outs.size(); ++k) {
                  Tensor full;
                  {
                    NoGradGuard g;
                    full = is_dist(outs[k]) ? full_tensor(outs[k]) : outs[k];
                  }
                  std::string e = compare(full, s.outputs[k], 1e-9, 1e-11);
                  if (!e.empty() && problem.empty()) problem = fmt::format("output {}: {}", k, e);
                  if (!s.weights[k].defined() || !outs[k].requires_grad()) continue;
                  Tensor w;
                  {
                    NoGradGuard g;
                    w = shard_tensor(s.weights[k], mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()));
                  }
                  Tensor term = sum(mul(outs[k], w));
                  loss = loss.defined() ? add(loss, term) : term;
                }
                if (loss.defined()) backward(loss);
                for (size_t i = 0; i < dts.size() && problem.empty(); ++i) {
                  if (!s.grads[i].defined()) continue;
                  Tensor g = dts[i].grad();
                  if (!g.defined()) {
                    problem = fmt::format("input {} got no gradient", i);
                    break;
                  }
                  NoGradGuard ng;
                  std::string e = compare(full_tensor(g), s.grads[i], 1e-9, 1e-11);
                  if (!e.empty())
                    problem = fmt::format("gradient of input {} ({}): {}", i, placements_str(dist_attr(g).placements), e);
                }
              } catch (const std::exception& e) {
                problem = fmt::format("error: {}", e.what());
              }
              if (!problem.empty()) failures.push_back(fmt::format("rank {}: {}: {}", rank, where, problem));
              if (!problem.empty() && problem.find("error:") == 0) break;  // the group may be broken: stop here
            }
  return failures;
}

std::vector<std::string> validate(const OpCase& c, const Serial& s, const ProcessMesh& mesh,
                                  const std::vector<std::vector<Placements>>& combos) {
  std::vector<std::string> failures;
  std::mutex m;
  SpawnOptions opts;
  opts.timeout = Millis(20'000);
  opts.threads_per_rank = 1;
  try {
    spawn(static_cast<int>(mesh.size()),
          [&](int rank) {
            std::vector<std::string> mine = validate_on_rank(c, s, mesh, combos, rank);
            if (rank != 0 || mine.empty()) return;
            std::lock_guard lock(m);
            for (std::string& f : mine) failures.push_back(std::move(f));
          },
          opts);
  } catch (const std::exception& e) {
    std::lock_guard lock(m);
    if (failures.empty()) failures.push_back(fmt::format("{} on {}: {}", c.name, mesh.str(), e.what()));
  }
  return failures;
}

}  // namespace tessel::testing
