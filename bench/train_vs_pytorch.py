#!/usr/bin/python3
"""Training throughput of tessel beside PyTorch 1.13 (Debian's python3-torch) on the same
model, optimizer and batch, measured side by side in one run.

The model is the GPT-2 of configs/bench-gpt2.yaml (n_layer 4, n_embd 256, n_head 4, seq 128,
batch 8, vocab 512, AdamW, grad clip 1.0); the PyTorch side is bench/pytorch_gpt2.py trained
on random windows of the same corpus. For each thread count both are timed over the same
number of steps and the medians compared; the runs alternate so machine noise hits both.

  bench/train_vs_pytorch.py [--threads 1,2] [--steps 20] [--rounds 3] [--tessel build/release/tessel]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from same_blas import use_tessels_blas_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytorch_steps(threads, steps, warmup, cfg):
    """Returns the per-step times of a PyTorch run in a fresh process with `threads` threads."""
    code = f"""
import json, sys, time, torch
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from pytorch_gpt2 import gpt2_with_adamw
torch.set_num_threads({threads})
torch.manual_seed(1)
T, B = {cfg['seq_len']}, {cfg['batch']}
model, opt = gpt2_with_adamw({cfg['n_layer']}, {cfg['n_embd']}, {cfg['n_head']}, {cfg['vocab_size']}, T)
data = torch.frombuffer(bytearray(open({cfg['data']!r}, 'rb').read()), dtype=torch.uint8).long()
g = torch.Generator().manual_seed(1)
times = []
for step in range({warmup + steps}):
    t0 = time.perf_counter()
    ix = torch.randint(len(data) - T - 1, (B,), generator=g)
    x = torch.stack([data[i:i + T] for i in ix]); y = torch.stack([data[i + 1:i + T + 1] for i in ix])
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
print(json.dumps({{"times": times[{warmup}:], "loss": loss.item()}}))
"""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = subprocess.run(["/usr/bin/python3", "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: the PyTorch run failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])["times"]


def tessel_steps(binary, config, threads, steps, warmup):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "bench", "train", config, "--threads", str(threads), "--steps", str(steps),
                          "--warmup", str(warmup), "--json"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: tessel bench train failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--steps", type=int, default=20, help="measured steps per run (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured warm-up steps (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each side (default 3)")
    ap.add_argument("--tessel", default=os.path.join(ROOT, "build/release/tessel"), help="the tessel binary")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/bench-gpt2.yaml"))
    args = ap.parse_args()
    if not os.path.exists(args.tessel):
        sys.exit(f"error: {args.tessel} not found; build first (./run.sh build)")
    cfg = dict(n_layer=4, n_embd=256, n_head=4, vocab_size=512, seq_len=128, batch=8,
               data=os.path.join(ROOT, "data/kjv.txt"))
    tokens = cfg["seq_len"] * cfg["batch"]
    # Both sides call the same OpenBLAS, on the same kernel set (same_blas.py), which sets the GEMM
    # rate: name it, or the figures cannot be compared with another host's.
    print(f"BLAS (both sides): {use_tessels_blas_kernels(args.tessel)}")
    print(f"GPT-2 n_layer {cfg['n_layer']}, n_embd {cfg['n_embd']}, n_head {cfg['n_head']}, seq {cfg['seq_len']}, "
          f"batch {cfg['batch']}, vocab {cfg['vocab_size']}, AdamW; medians over {args.rounds} x {args.steps} steps")
    print(f"{'threads':>7} {'tessel tok/s':>13} {'pytorch tok/s':>14} {'ratio':>7} {'tessel model FLOP/s':>20} "
          f"{'sgemm peak':>11} {'share':>6}")
    for threads in [int(t) for t in args.threads.split(",")]:
        ours, theirs, shares, flops, peaks = [], [], [], [], []
        for _ in range(args.rounds):
            j = tessel_steps(args.tessel, args.config, threads, args.steps, args.warmup)
            ours.append(j["step_time_s"])
            flops.append(j["model_flops_per_s"])
            peaks.append(j["sgemm_peak_flops_per_s"])
            shares.append(j["share_of_sgemm_peak"])
            theirs.append(statistics.median(pytorch_steps(threads, args.steps, args.warmup, cfg)))
        t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
        print(f"{threads:>7} {tokens / t_ours:>13.0f} {tokens / t_theirs:>14.0f} {t_theirs / t_ours:>6.2f}x "
              f"{statistics.median(flops) / 1e9:>14.1f} GF/s {statistics.median(peaks) / 1e9:>6.1f} GF/s "
              f"{100 * statistics.median(shares):>5.1f}%")


if __name__ == "__main__":
    main()
