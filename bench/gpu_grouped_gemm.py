#!/usr/bin/env python3
"""The experts' grouped GEMMs of a Mixtral layer on one NVIDIA GPU, for the planner's MoE cost.

The planner (docs/plan.md, "Mixture of experts") charges a sparse block's experts as grouped
GEMMs whose rate is that of one GEMM of the rows each local expert receives: with E/ep local
experts sharing R = tokens x top_k rows, each group is an (R·ep/E) x hidden x ffn product on the
device's GEMM efficiency curve. This measures, for Mixtral 8x7B's expert shapes (hidden 4096,
ffn 14336) and the 8192 rows one rank routes per sequence of 4096 tokens (top 2):

  dense:   one R x 4096 x 14336 linear, forward and both backward products (the rate of a plain
           GEMM of the whole batch of rows)
  grouped: the same FLOPs split into g = 1, 2, 4, 8 equal groups (ep 8, 4, 2, 1 of 8 experts),
           by torch._grouped_mm where this PyTorch has it, and by a loop of g GEMMs
  single:  one GEMM of a group's size alone (R/g rows), the planner's stand-in for the group

and prints JSON with each one's TFLOP/s.

Usage: python3 bench/gpu_grouped_gemm.py > out.json   (under a minute on an H100)
"""
import json
import sys

import torch

dev = torch.device("cuda")
bf16 = torch.bfloat16
H, F, R = 4096, 14336, 8192


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


def triple_loop(xs, ws, dys):
    """Per group: y = x @ w, dx = dy @ w^T, dw = x^T @ dy (x [r, H], w [H, F], dy [r, F])."""
    def run():
        for x, w, dy in zip(xs, ws, dys):
            torch.matmul(x, w)
            torch.matmul(dy, w.t())
            torch.matmul(x.t(), dy)
    return run


def triple_grouped(x, w, dy, offs):
    """The same three products as torch._grouped_mm calls: x [R, H], w [g, H, F], dy [R, F]."""
    wt = w.transpose(-2, -1)
    xt = x.t()

    def run():
        torch._grouped_mm(x, w, offs=offs)
        torch._grouped_mm(dy, wt, offs=offs)
        torch._grouped_mm(xt, dy, offs=offs)
    return run


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": R, "hidden": H, "ffn": F}
    flops = 3 * 2.0 * R * H * F
    # Clocks settle first, as bench/gpu_kernels.py does.
    a = torch.randn(8192, 8192, device=dev, dtype=bf16)
    timed(lambda: torch.matmul(a, a), 1000)
    x = torch.randn(R, H, device=dev, dtype=bf16)
    dy = torch.randn(R, F, device=dev, dtype=bf16)
    w1 = torch.randn(H, F, device=dev, dtype=bf16)
    out["dense_tflops"] = flops / timed(triple_loop([x], [w1], [dy]), 20) / 1e12
    rows = []
    for g in (1, 2, 4, 8):
        r = R // g
        w = torch.randn(g, H, F, device=dev, dtype=bf16)
        xs, dys = list(x.split(r)), list(dy.split(r))
        row = {"groups": g, "rows_per_group": r,
               "loop_tflops": flops / timed(triple_loop(xs, list(w.unbind(0)), dys), 20) / 1e12,
               "single_group_tflops": flops / g / timed(triple_loop(xs[:1], [w[0]], dys[:1]), 20) / 1e12}
        if hasattr(torch, "_grouped_mm"):
            offs = torch.arange(r, R + 1, r, device=dev, dtype=torch.int32)
            try:
                row["grouped_mm_tflops"] = flops / timed(triple_grouped(x, w, dy, offs), 20) / 1e12
            except (RuntimeError, TypeError) as e:  # not on this GPU or build
                row["grouped_mm_error"] = str(e).splitlines()[0]
        rows.append(row)
    out["grouped"] = rows
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
