#!/usr/bin/python3
"""Fused attention of tessel beside PyTorch 1.13's CPU attention (Debian's python3-torch),
forward + backward at the same shapes, measured in one run.

PyTorch 1.13 has no fused CPU attention, so its side is the explicit form with autograd:
out = softmax(q k^T / sqrt(D) + causal mask) v, then out.backward(gy). Shapes follow
bench/attention_bench: causal, 4 heads of 64 (GPT-2-tiny widths), B*T tokens fixed (32k), T from
1k to 32k. Where one [B, H, T, T] score tensor would pass 2^27 values (512 MiB in f32; the 32k
one is 16 GiB), PyTorch runs the same attention in pieces — batch rows, then heads, then
blocks of query rows against all keys, each piece its own forward and backward with the
gradients accumulating — which is still exact attention and bounds its memory. Both sides
use the same thread count (torch.set_num_threads, tessel's --threads) and the same clock.
Medians (of --reps; one run at T >= 8k, where one run takes seconds to minutes).

  bench/attention_vs_pytorch.py [--threads 1] [--tokens 32768] [--t 1024,2048,4096,8192,16384,32768]
                                [--reps 3] [--clock wall|cpu] [--bench build/release/bench/attention_bench]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from same_blas import use_tessels_blas_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADS, HEAD_DIM = 4, 64
MAX_SCORES = 1 << 27


def torch_times(threads, tokens, ts, reps, clock):
    """Per T: the median ms of PyTorch's explicit attention forward + backward, in a fresh process."""
    code = f"""
import json, math, time, torch
torch.set_num_threads({threads})
clock = time.process_time if {clock!r} == "cpu" else time.perf_counter
print(json.dumps({{"version": torch.__version__}}), flush=True)
out = {{}}
for T in {ts!r}:
    B, H, D = max(1, {tokens} // T), {HEADS}, {HEAD_DIM}
    g = torch.Generator().manual_seed(1)
    q, k, v, gy = (torch.rand(B, H, T, D, generator=g) * 2 - 1 for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    # Pieces: whole batch rows while they fit, else single heads, else blocks of query rows.
    rows = T if B * H * T * T <= {MAX_SCORES} else max(1, {MAX_SCORES} // T)
    per_b = B if B * H * T * T <= {MAX_SCORES} else 1
    per_h = H if per_b * H * T * T <= {MAX_SCORES} else 1
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    times = []
    for rep in range({reps} if T < 8192 else 1):
        for t in (q, k, v):
            t.grad = None
        t0 = clock()
        for b0 in range(0, B, per_b):
            for h0 in range(0, H, per_h):
                for r0 in range(0, T, rows):
                    qs = q[b0:b0 + per_b, h0:h0 + per_h, r0:r0 + rows]
                    ks, vs = k[b0:b0 + per_b, h0:h0 + per_h], v[b0:b0 + per_b, h0:h0 + per_h]
                    s = (qs @ ks.transpose(-1, -2)) / math.sqrt(D)
                    s = s.masked_fill(mask[r0:r0 + rows], float("-inf"))
                    o = torch.softmax(s, dim=-1) @ vs
                    o.backward(gy[b0:b0 + per_b, h0:h0 + per_h, r0:r0 + rows])
        times.append((clock() - t0) * 1e3)
    out[T] = sorted(times)[len(times) // 2]
    print(json.dumps({{"T": T, "ms": out[T]}}), flush=True)
"""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    res = subprocess.run(["/usr/bin/python3", "-c", code], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"error: the PyTorch run failed:\n{res.stderr}")
    lines = [json.loads(line) for line in res.stdout.strip().splitlines()]
    return lines[0]["version"], {r["T"]: r["ms"] for r in lines[1:]}


def tessel_figures(binary, threads, tokens, ts, reps, clock):
    args = [binary, "--threads", str(threads), "--tokens", str(tokens), "--t", ",".join(map(str, ts)),
            "--reps", str(reps), "--clock", clock, "--json"]
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"error: {binary} failed:\n{res.stderr}")
    return [json.loads(line) for line in res.stdout.strip().splitlines()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--t", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build/release/bench/attention_bench"))
    a = ap.parse_args()
    ts = [int(x) for x in a.t.split(",")]
    if not os.path.exists(a.bench):
        sys.exit(f"error: {a.bench} not found; build it with cmake --build --preset release --target attention_bench")
    # PyTorch's products run on OpenBLAS: on the kernel set tessel runs (same_blas.py).
    tessel_binary = os.path.join(os.path.dirname(a.bench), "..", "tessel")
    blas = use_tessels_blas_kernels(tessel_binary) if os.path.exists(tessel_binary) else "unknown"
    rows = tessel_figures(a.bench, a.threads, a.tokens, ts, a.reps, a.clock)
    version, torch_ms = torch_times(a.threads, a.tokens, ts, a.reps, a.clock)
    print(f"attention forward+backward, causal, H={HEADS} D={HEAD_DIM} B*T={a.tokens} f32, {a.threads} thread(s), "
          f"{a.clock} clock, medians; PyTorch {version} explicit softmax(QK^T)V; BLAS: {blas}")
    print(f"{'T':>6} {'B':>3} | {'tessel fused ms':>15} {'peak MiB':>9} | {'unfused ms':>10} {'fused x':>7} | "
          f"{'PyTorch ms':>10} {'fused x':>7}")
    peaks = {}
    for r in rows:
        if "docs" in r:
            print(f"T={r['T']} as {r['docs']} documents: tessel fused {r['fused_ms']:.1f} ms")
            continue
        T = r["T"]
        peaks[T] = r["fused_peak_bytes"]
        unf = f"{r['unfused_ms']:>10.1f} {r['unfused_ms'] / r['fused_ms']:>6.2f}x" if "unfused_ms" in r else \
            f"{'-':>10} {'-':>7}"
        pt = torch_ms.get(T)
        print(f"{T:>6} {r['B']:>3} | {r['fused_ms']:>15.1f} {r['fused_peak_bytes'] / 2**20:>9.1f} | {unf} | "
              f"{pt:>10.1f} {pt / r['fused_ms']:>6.2f}x")
    if 8192 in peaks and 32768 in peaks:
        print(f"tessel fused peak growth T=8k -> 32k: {peaks[32768] / peaks[8192]:.2f}x")


if __name__ == "__main__":
    main()
