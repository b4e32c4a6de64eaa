#!/usr/bin/python3
"""2-rank data-parallel training throughput of tessel beside PyTorch 1.13 DistributedDataParallel
(Debian's python3-torch, gloo backend, 2 processes), on the same model and global batch, measured
side by side in one run.

The model is the GPT-2 of configs/bench-gpt2.yaml (n_layer 4, n_embd 256, n_head 4, seq 128,
vocab 512, AdamW, grad clip 1.0) with global batch 8, i.e. 4 rows x 128 tokens per rank, and one
intra-op thread per rank. Three variants are timed:

  tessel-thread  tessel train --set parallel.dp=2 (both ranks as threads of one process)
  tessel-gloo    tessel launch --nproc-per-node 2 -- tessel train ... --backend gloo
  gloo-zero2     the same with parallel.sharding_stage=2 (gradients reduce-scattered in buckets)
  pytorch-ddp    this script started twice (one process per rank), DDP over gloo on loopback,
                 the GPT-2 of bench/pytorch_gpt2.py (pre-LN, tanh GELU, tied head,
                 masked-softmax attention), AdamW(1e-3, (0.9, 0.95), wd 0.1), clip_grad_norm_ 1.0

Each run does warmup + steps steps; the warm-up steps are dropped and the median step time of
rank 0 is kept (tessel: step_time_s of its --metrics file; PyTorch: perf_counter around each
step, after a barrier that starts both ranks together). Rounds alternate the three variants and
rotate their order so machine noise hits all of them; ratios are tokens/s over pytorch-ddp's,
taken per round, and the summary gives medians over rounds.

Each tessel run also writes a --trace; its "grad sync" slices are where a rank was blocked on
gradient synchronisation (waiting for a bucket's collective, or in a collective of the optimizer
step): the exposed, not overlapped, part. The "sync" columns give that time as a share of the
measured steps' wall time, the larger of the two ranks'.

  bench/ddp_vs_pytorch.py [--rounds 3] [--steps 15] [--warmup 3] [--tessel build/release/tessel]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

from same_blas import use_tessels_blas_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(n_layer=4, n_embd=256, n_head=4, vocab_size=512, seq_len=128, global_batch=8, ranks=2)
ONE_THREAD = dict(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def ddp_worker(rank, port, steps, warmup):
    """One rank of the PyTorch DDP run; rank 0 prints its per-step times as one JSON line."""
    import time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from pytorch_gpt2 import gpt2_with_adamw

    torch.set_num_threads(1)
    torch.manual_seed(1)  # same initial weights on both ranks (DDP also broadcasts rank 0's)
    T = CFG["seq_len"]
    B = CFG["global_batch"] // CFG["ranks"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=CFG["ranks"])
    model, opt = gpt2_with_adamw(CFG["n_layer"], CFG["n_embd"], CFG["n_head"], CFG["vocab_size"], T)
    ddp = DDP(model)
    with open(os.path.join(ROOT, "data/kjv.txt"), "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(1 + rank)  # each rank draws its own windows
    times = []
    for _ in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        ix = torch.randint(len(data) - T - 1, (B,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets over gloo here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"times": times[warmup:], "loss": loss.item()}))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytorch_ddp(steps, warmup):
    """Starts this script once per rank; returns (median step time, final loss) of rank 0."""
    port, env = free_port(), dict(os.environ, **ONE_THREAD)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--port", str(port),
                               "--steps", str(steps), "--warmup", str(warmup)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(CFG["ranks"])]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=600))
        except subprocess.TimeoutExpired:
            outs.append(("", "timed out after 600 s"))
    for p in procs:
        if p.poll() is None:
            p.kill()
    for r, (p, (_, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            sys.exit(f"error: PyTorch DDP rank {r} failed (exit {p.returncode}):\n{err}")
    j = json.loads(outs[0][0].strip().splitlines()[-1])
    return statistics.median(j["times"]), j["loss"]


def exposed_sync_share(trace_path, warmup):
    """The largest share, over ranks, of the measured steps' wall time spent in "grad sync" slices.

    A step ends with its "optimizer step" slice; the measured window runs from the end of the
    last warm-up step to the end of the last step."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    shares = []
    for rank in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == rank]
        ends = sorted(e["ts"] + e["dur"] for e in mine if e["name"] == "optimizer step")
        lo, hi = ends[warmup - 1] if warmup > 0 else min(e["ts"] for e in mine), ends[-1]
        sync = sum(max(0.0, min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)) for e in mine if e["cat"] == "grad sync")
        shares.append(sync / (hi - lo))
    return max(shares)


def tessel(binary, config, backend, steps, warmup, stage=0):
    """Runs tessel train with dp=2 on `backend`; returns (median step time, final loss) of rank 0 and the
    exposed gradient-sync share read from the trace."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics, trace = os.path.join(tmp, "metrics.jsonl"), os.path.join(tmp, "trace.json")
        train = [binary, "train", config, "--set", "parallel.dp=2", "--set", "train.threads=1",
                 "--set", f"parallel.sharding_stage={stage}",
                 "--set", f"train.steps={warmup + steps}", "--metrics", metrics, "--trace", trace]
        cmd = train if backend == "thread" else \
            [binary, "launch", "--nproc-per-node", str(CFG["ranks"]), "--"] + train + ["--backend", "gloo"]
        out = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **ONE_THREAD), capture_output=True, text=True,
                             timeout=600)
        if out.returncode != 0:
            sys.exit(f"error: tessel ({backend}) failed (exit {out.returncode}): {' '.join(cmd)}\n{out.stderr}")
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        share = exposed_sync_share(trace, warmup)
    if len(rows) != warmup + steps:
        sys.exit(f"error: tessel ({backend}) wrote {len(rows)} metrics lines, expected {warmup + steps}")
    return statistics.median(r["step_time_s"] for r in rows[warmup:]), rows[-1]["loss"], share


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three variants (default 3)")
    ap.add_argument("--steps", type=int, default=15, help="measured steps per run (default 15)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured warm-up steps before them (default 3)")
    ap.add_argument("--tessel", default=os.path.join(ROOT, "build/release/tessel"), help="the tessel binary")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/bench-gpt2.yaml"), help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # internal: run as one PyTorch DDP rank
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        return ddp_worker(args.rank, args.port, args.steps, args.warmup)
    if not os.path.exists(args.tessel):
        sys.exit(f"error: {args.tessel} not found; build first (./run.sh build)")
    tokens = CFG["seq_len"] * CFG["global_batch"]
    runs = {
        "tessel-thread": lambda: tessel(args.tessel, args.config, "thread", args.steps, args.warmup),
        "tessel-gloo": lambda: tessel(args.tessel, args.config, "gloo", args.steps, args.warmup),
        "gloo-zero2": lambda: tessel(args.tessel, args.config, "gloo", args.steps, args.warmup, stage=2),
        "pytorch-ddp": lambda: pytorch_ddp(args.steps, args.warmup) + (None,),
    }
    names = list(runs)
    # Both sides call the same OpenBLAS, on the same kernel set (same_blas.py), which sets the GEMM
    # rate: name it, or the figures cannot be compared with another host's.
    print(f"BLAS (both sides): {use_tessels_blas_kernels(args.tessel)}")
    print(f"GPT-2 n_layer {CFG['n_layer']}, n_embd {CFG['n_embd']}, n_head {CFG['n_head']}, seq {CFG['seq_len']}, "
          f"vocab {CFG['vocab_size']}, AdamW; dp {CFG['ranks']}, global batch {CFG['global_batch']} "
          f"({CFG['global_batch'] // CFG['ranks']} rows/rank), 1 thread/rank; "
          f"median of {args.steps} steps after {args.warmup} warm-up, {args.rounds} rounds")
    print(f"{'round':>6} {'tessel-thread':>14} {'tessel-gloo':>12} {'gloo-zero2':>11} {'pytorch-ddp':>12} "
          f"{'thread/ddp':>11} {'gloo/ddp':>9} {'z2/ddp':>7} {'sync thr':>9} {'gloo':>6} {'z2':>6}"
          f"   (tokens/s; order run)")
    tps = {n: [] for n in names}
    loss, sync = {}, {n: [] for n in names if n != "pytorch-ddp"}
    ratios = {"thread": [], "gloo": [], "zero2": []}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {}
        for n in order:
            t, loss[n], share = runs[n]()
            got[n] = tokens / t
            tps[n].append(got[n])
            if share is not None:
                sync[n].append(share)
        for key, n in (("thread", "tessel-thread"), ("gloo", "tessel-gloo"), ("zero2", "gloo-zero2")):
            ratios[key].append(got[n] / got["pytorch-ddp"])
        print(f"{r + 1:>6} {got['tessel-thread']:>14.0f} {got['tessel-gloo']:>12.0f} {got['gloo-zero2']:>11.0f} "
              f"{got['pytorch-ddp']:>12.0f} {ratios['thread'][-1]:>10.2f}x {ratios['gloo'][-1]:>8.2f}x "
              f"{ratios['zero2'][-1]:>6.2f}x {sync['tessel-thread'][-1]:>9.1%} {sync['tessel-gloo'][-1]:>6.1%} "
              f"{sync['gloo-zero2'][-1]:>6.1%}   ({', '.join(order)})", flush=True)
    med = {n: statistics.median(v) for n, v in tps.items()}
    ms = {n: statistics.median(v) for n, v in sync.items()}
    mr = {k: statistics.median(v) for k, v in ratios.items()}
    print(f"{'median':>6} {med['tessel-thread']:>14.0f} {med['tessel-gloo']:>12.0f} {med['gloo-zero2']:>11.0f} "
          f"{med['pytorch-ddp']:>12.0f} {mr['thread']:>10.2f}x {mr['gloo']:>8.2f}x {mr['zero2']:>6.2f}x "
          f"{ms['tessel-thread']:>9.1%} {ms['tessel-gloo']:>6.1%} {ms['gloo-zero2']:>6.1%}")
    print("final loss (last round): " + ", ".join(f"{n} {loss[n]:.4f}" for n in names))
    print(f"ratio (tessel tokens/s / PyTorch DDP tokens/s, median over rounds): "
          f"thread {mr['thread']:.2f}x, gloo {mr['gloo']:.2f}x, gloo ZeRO-2 {mr['zero2']:.2f}x")
    print(f"exposed gradient-sync share of a step (from the trace, median over rounds): thread "
          f"{ms['tessel-thread']:.1%}, gloo {ms['tessel-gloo']:.1%}, gloo ZeRO-2 {ms['gloo-zero2']:.1%}")


if __name__ == "__main__":
    main()
