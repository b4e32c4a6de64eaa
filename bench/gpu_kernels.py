#!/usr/bin/env python3
"""Kernel rates of one NVIDIA GPU through PyTorch, for the planner's device calibration.

What a device preset's calibration says (docs/plan.md, "Devices and software profiles"): the
share of the datasheet peak a bf16 GEMM reaches as a function of its size, the share of the
memory bandwidth a streaming kernel reaches, and what a fused causal attention kernel reaches
relative to a GEMM of its size. This measures each on the GPU it runs on and prints JSON:

  gemm:      [{m, n, k, tflops}]   squares and the transformer shapes of the Megatron-Core r0.8
                                   H100 table (4096 tokens x hidden x width/tp), forward and
                                   both backward products (dgrad, wgrad) timed together
  sdpa:      [{heads, seq, d, tflops_full}]  causal fwd+bwd, FLOPs counted over the whole s x s
                                   (3 x 4·b·h·s²·d, the count the cost model charges)
  stream:    copy / layer_norm / gelu bytes per second
  launch_us: a tiny kernel's time per call, launches back to back

Usage: python3 bench/gpu_kernels.py > out.json   (about two minutes on an H100)
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

dev = torch.device("cuda")
bf16 = torch.bfloat16


def timed(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def gemm_triple(m, n, k, iters):
    """x [m,k] @ w^T (w [n,k]), then dx = dy @ w and dw = dy^T @ x: a linear's three GEMMs."""
    x = torch.randn(m, k, device=dev, dtype=bf16)
    w = torch.randn(n, k, device=dev, dtype=bf16)
    dy = torch.randn(m, n, device=dev, dtype=bf16)

    def run():
        torch.matmul(x, w.t())
        torch.matmul(dy, w)
        torch.matmul(dy.t(), x)

    t = timed(run, iters)
    return 3 * 2.0 * m * n * k / t / 1e12


def gemm_one(n, iters):
    a = torch.randn(n, n, device=dev, dtype=bf16)
    b = torch.randn(n, n, device=dev, dtype=bf16)
    t = timed(lambda: torch.matmul(a, b), iters)
    return 2.0 * n ** 3 / t / 1e12


def sdpa(heads, seq, d, iters):
    q = torch.randn(1, heads, seq, d, device=dev, dtype=bf16, requires_grad=True)
    k = torch.randn(1, heads, seq, d, device=dev, dtype=bf16, requires_grad=True)
    v = torch.randn(1, heads, seq, d, device=dev, dtype=bf16, requires_grad=True)
    g = torch.randn(1, heads, seq, d, device=dev, dtype=bf16)

    def run():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(g)

    t = timed(run, iters)
    return 3 * 4.0 * heads * seq * seq * d / t / 1e12


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    # Sustained first: 8192^3 for ~10 s, so the clocks settle where a training run holds them.
    out["gemm_8192_sustained_tflops"] = gemm_one(8192, 5000)
    out["gemm_square"] = [{"n": n, "tflops": gemm_one(n, 200 if n <= 4096 else 40)}
                          for n in (512, 1024, 2048, 4096, 8192, 16384)]
    shapes = []
    # (hidden, tp) of the README's rows; 4096 tokens per micro-batch (seq 4096, mbs 1).
    for h, tp in ((2048, 1), (4096, 2), (6144, 4), (7168, 8), (8192, 8), (10240, 8), (12288, 8), (16384, 8),
                  (18432, 8)):
        for name, n, k in (("qkv", 3 * h // tp, h), ("proj", h, h // tp), ("fc1", 4 * h // tp, h),
                           ("fc2", h, 4 * h // tp)):
            shapes.append({"h": h, "tp": tp, "op": name, "m": 4096, "n": n, "k": k,
                           "tflops": gemm_triple(4096, n, k, 20)})
        shapes.append({"h": h, "tp": tp, "op": "logits", "m": 4096, "n": 131072 // tp, "k": h,
                       "tflops": gemm_triple(4096, 131072 // tp, h, 5)})
    out["gemm_linear"] = shapes
    # MT-NLG / Narayanan-sized shapes on A100 are not measurable here; the same curve is kept
    # for H100 shapes of seq 2048 for comparison.
    out["sdpa"] = [{"heads": hh, "seq": s, "d": 128, "tflops_full": sdpa(hh, s, 128, 20)}
                   for hh, s in ((16, 4096), (8, 4096), (4, 4096), (16, 2048), (8, 2048))]
    n = 1 << 28  # 512 MiB of bf16
    a = torch.empty(n, device=dev, dtype=bf16)
    b = torch.empty(n, device=dev, dtype=bf16)
    t = timed(lambda: b.copy_(a), 50)
    stream = {"copy_gbps": 2 * 2 * n / t / 1e9}
    x = torch.randn(4096 * 4, 8192, device=dev, dtype=bf16)
    wln = torch.ones(8192, device=dev, dtype=bf16)
    t = timed(lambda: F.layer_norm(x, (8192,), wln, wln), 50)
    stream["layer_norm_gbps"] = 2 * 2 * x.numel() / t / 1e9
    t = timed(lambda: F.gelu(x, approximate="tanh"), 50)
    stream["gelu_gbps"] = 2 * 2 * x.numel() / t / 1e9
    out["stream"] = stream
    s = torch.ones(4, device=dev)
    t = timed(lambda: s.add_(1), 2000, warm=100)
    out["launch_us"] = t * 1e6
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
