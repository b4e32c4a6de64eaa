// ZeRO-3 gathers unit by unit, with prefetch and the buffers freed between uses.
#include "tessel/parallel/param_gather.h"

#include "tessel/autograd/engine.h"
#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/dist/comm_buffers.h"
#include "tessel/dist/dtensor.h"

namespace tessel::parallel {

struct ParamGather::Entry {
  nn::Parameter* p = nullptr;
  Placements stored, gathered;  // dp: Shard(d) -> Replicate
  Tensor full;                  // the gathered local piece; its storage is released between uses
  int64_t rows = 1;             // all_gather_v's rows form: the dims before d ...
  std::vector<int64_t> counts;  // ... and each dp rank's elements per row
  WorkPtr work;                 // a gather in flight into `full`
};

struct ParamGather::Unit {
  std::vector<Entry> entries;
};

ParamGather::~ParamGather() {
  for (auto& chunk : chunks_)
    for (auto& u : chunk)
      for (Entry& e : u->entries)
        if (e.work) e.work->wait();
}

ParamGather::ParamGather(const Layout& layout, std::vector<std::vector<std::vector<nn::Parameter*>>> units)
    : layout_(layout) {
  const size_t dp_dim = static_cast<size_t>(layout_.stage_dim("dp")), tp_dim = static_cast<size_t>(layout_.stage_dim("tp"));
  const int64_t dp = layout_.degree("dp");
  MemoryKindScope charge(MemoryKind::params);  // a gathered weight is parameter bytes
  for (auto& chunk : units) {
    chunks_.emplace_back();
    for (auto& params : chunk) {
      auto u = std::make_unique<Unit>();
      for (nn::Parameter* p : params) {
        if (!p->value.defined() || !is_dist(p->value)) continue;
        Entry e;
        e.p = p;
        e.stored = e.gathered = dist_attr(p->value).placements;
        if (!e.stored[dp_dim].is_shard()) continue;  // not sharded over dp
        const int64_t d = e.stored[dp_dim].dim;
        if (layout_.degree("tp") > 1 && e.stored[tp_dim].is_shard(d)) continue;  // nested: reshard gathers it
        e.gathered[dp_dim] = Replicate();
        const Tensor& shard = local_piece(p->value);
        Shape full = shard.shape();
        full[static_cast<size_t>(d)] = p->shape[static_cast<size_t>(d)];
        int64_t inner = 1;
        for (size_t i = 0; i < full.size(); ++i) {
          if (static_cast<int64_t>(i) < d) e.rows *= full[i];
          if (static_cast<int64_t>(i) > d) inner *= full[i];
        }
        for (int64_t r = 0; r < dp; ++r) e.counts.push_back(split_size(full[static_cast<size_t>(d)], dp, r) * inner);
        e.full = Tensor::empty(full, p->value.dtype());
        e.full.storage()->release();
        u->entries.push_back(std::move(e));
      }
      chunks_.back().push_back(std::move(u));
    }
  }
}

ParamGather::Unit& ParamGather::unit(int chunk, size_t u) {
  TESSEL_ASSERT(chunk >= 0 && static_cast<size_t>(chunk) < chunks_.size() && u < chunks_[static_cast<size_t>(chunk)].size(),
                "param gather: no unit {} in chunk {}", u, chunk);
  return *chunks_[static_cast<size_t>(chunk)][u];
}

void ParamGather::launch(Unit& u) {
  auto group = layout_.group("dp");
  for (Entry& e : u.entries) {
    if (e.work || !e.full.storage()->released()) continue;  // in flight, or gathered already
    e.full.storage()->restore();
    const Tensor& shard = local_piece(e.p->value);
    CommBuffers cb;
    e.work = cb.finish(group->all_gather_v_async(cb.in(shard), cb.out(e.full), e.counts, shard.dtype(), e.rows));
  }
}

void ParamGather::wait(Unit& u) {
  ProfileScope profile_scope("(param gather wait)");
  for (Entry& e : u.entries)
    if (e.work) {
      e.work->wait();
      e.work = nullptr;
    }
}

void ParamGather::finish_step() {
  for (auto& chunk : chunks_)
    for (auto& u : chunk) {
      wait(*u);
      for (Entry& e : u->entries) e.full.storage()->release();
    }
}

Tensor ParamGather::run(int chunk, size_t index, const Tensor& x, const std::function<Tensor(const Tensor&)>& fn) {
  Unit& u = unit(chunk, index);
  if (u.entries.empty()) return fn(x);
  launch(u);  // no-op for what a prefetch started
  wait(u);
  const size_t units = chunks_[static_cast<size_t>(chunk)].size();
  // Prefetch the next unit, unless this forward is a recompute inside the backward (which goes
  // the other way).
  if (index + 1 < units && !in_backward()) launch(unit(chunk, index + 1));
  const ProcessMesh mesh = layout_.stage_mesh();
  const bool recording = grad_enabled();
  std::vector<std::function<Tensor(const Tensor&)>> before;
  for (Entry& e : u.entries) {
    before.push_back(e.p->gather);
    // The gathered weight as the forward sees it: a view of `full`, whose backward reduces the
    // gradient onto the dp shard and then frees `full` (no op reads it after that).
    Tensor used = wrap_dtensor(e.full, DistAttr(mesh, e.gathered), e.p->shape);
    if (recording && e.p->value.requires_grad()) {
      Entry* entry = &e;
      record_function("zero3.gather", {e.p->value}, {used}, [this, entry, mesh](std::vector<Tensor>&& g) {
        Tensor out;
        if (g[0].defined() && !(sink_ && sink_(entry->p, g[0]))) out = reshard(g[0], mesh, entry->stored);
        entry->full.storage()->release();
        return std::vector<Tensor>{out};
      });
    }
    e.p->gather = [used](const Tensor&) { return used; };
  }
  Tensor y;
  try {
    y = fn(x);
  } catch (...) {
    for (size_t k = 0; k < u.entries.size(); ++k) u.entries[k].p->gather = before[k];
    throw;
  }
  for (size_t k = 0; k < u.entries.size(); ++k) {
    u.entries[k].p->gather = before[k];
    u.entries[k].full.storage()->release();
  }
  if (!recording || !y.requires_grad()) return y;
  // When the backward reaches this unit's output: gather again, and start the unit before.
  Tensor out = is_dist(y) ? wrap_dtensor(local_piece(y), dist_attr(y), y.shape()) : y.detach();
  record_function("zero3.regather", {y}, {out}, [this, chunk, index](std::vector<Tensor>&& g) {
    Unit& me = unit(chunk, index);
    launch(me);
    wait(me);
    if (index > 0) launch(unit(chunk, index - 1));
    return std::move(g);
  });
  return out;
}

}  // namespace tessel::parallel
