#!/usr/bin/python3
"""ZeRO's memory as the OS sees it: the peak resident set of every process of a data-parallel run
on Gloo, stage by stage, beside the savings the ZeRO paper's formulas promise.

The model is GPT-2 124M (configs/gpt2-small.yaml: n_embd 768, n_head 12, 12 layers, vocabulary
50257) on 64-token rows, trained for a few steps with AdamW on 4 processes (dp 4,
`tessel launch --nproc-per-node 4 -- tessel train ... --backend gloo`), two micro-batches of one
64-token row per rank and step (ZeRO-2 differs from ZeRO-1 where gradients accumulate over
micro-batches: stage 1 holds them whole until the step, stage 2 reduces each micro-batch's as the
backward makes them; with one micro-batch both free the full-size gradients bucket by bucket). Each rank logs its peak resident memory as getrusage() reports it; the table gives the
largest over the ranks per stage, the fall from the stage before, and the fall ZeRO's formulas
promise for that stage (Rajbhandari et al. 2020, fp32 parameters and gradients, AdamW's two fp32
moments, N = 4 ranks, Ψ parameters):

  stage 0 -> 1: optimizer states, 8Ψ(N-1)/N bytes
  stage 1 -> 2: gradients,        4Ψ(N-1)/N
  stage 2 -> 3: parameters,       4Ψ(N-1)/N

  bench/zero_memory.py [--steps 3] [--micro-batches 2] [--tessel build/release/tessel] [--layers 12]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


def run(binary, stage, steps, layers, ranks, micro_batches):
    train = [binary, "train", os.path.join(ROOT, "configs/gpt2-small.yaml"), "--backend", "gloo",
             "--set", f"parallel.dp={ranks}", "--set", f"parallel.sharding_stage={stage}",
             "--set", f"model.n_layer={layers}", "--set", "model.n_positions=64", "--set", "train.seq_len=64",
             "--set", f"train.global_batch={ranks * micro_batches}", "--set", f"parallel.micro_batches={micro_batches}",
             "--set", f"train.steps={steps}", "--set", "train.warmup=0",
             "--set", "train.threads=1", "--set", "train.save_every=0"]
    cmd = [binary, "launch", "--nproc-per-node", str(ranks), "--"] + train
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"error: stage {stage} failed (exit {out.returncode}): {' '.join(cmd)}\n{out.stderr[-4000:]}")
    text = out.stdout + out.stderr
    params = re.search(r"([0-9.]+)M parameters", text)
    rss = [size(m) for m in re.findall(r"peak resident ([0-9.]+ [KMG]iB) \(the OS's\)", text)]
    if params is None or len(rss) != ranks:
        sys.exit(f"error: stage {stage}: could not read the parameter count and {ranks} peak resident lines:\n{text[-4000:]}")
    return float(params.group(1)) * 1e6, max(rss)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="training steps per stage (default 3)")
    ap.add_argument("--layers", type=int, default=12, help="transformer blocks (default 12, as GPT-2 124M)")
    ap.add_argument("--ranks", type=int, default=4, help="data-parallel processes (default 4)")
    ap.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step (default 2)")
    ap.add_argument("--tessel", default=os.path.join(ROOT, "build/release/tessel"), help="the tessel binary")
    args = ap.parse_args()
    if not os.path.exists(args.tessel):
        sys.exit(f"error: {args.tessel} not found; build first (./run.sh build)")
    n = args.ranks
    peaks, psi = [], 0.0
    for stage in range(4):
        psi, peak = run(args.tessel, stage, args.steps, args.layers, n, args.micro_batches)
        peaks.append(peak)
        print(f"stage {stage}: peak resident {peak / 2**20:8.1f} MiB (largest of {n} ranks)", flush=True)
    ideal = [8 * psi * (n - 1) / n, 4 * psi * (n - 1) / n, 4 * psi * (n - 1) / n]
    what = ["optimizer states", "gradients", "parameters"]
    print(f"\n{psi / 1e6:.1f}M parameters, dp {n}")
    print(f"{'step':>10} {'measured fall':>14} {'ZeRO ideal':>11} {'share':>7}  (what the stage shards)")
    ok = True
    for s in range(3):
        fall = peaks[s] - peaks[s + 1]
        share = fall / ideal[s]
        ok = ok and share >= 0.5
        print(f"{s} -> {s + 1:<5} {fall / 2**20:11.1f} MiB {ideal[s] / 2**20:7.1f} MiB {share:6.0%}  ({what[s]})")
    print("every fall is at least half of the ideal" if ok else "some fall is less than half of the ideal")


if __name__ == "__main__":
    main()
