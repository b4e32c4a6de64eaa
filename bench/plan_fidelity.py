#!/usr/bin/python3
"""Local fidelity of the planner: predicted step time beside the measured one for the hybrid
layouts tessel runs on this machine (GPT-2 tiny, thread backend, up to 8 ranks).

For each layout the machine is measured right before (`tessel cluster detect --ranks N`; a
shared host's speed drifts over minutes), `tessel plan --layout ... --format json` predicts the
step and `tessel train` runs it; the measured figure is the median step time after the warm-up
steps. Quote the median ratio: the host is noisy.

With --repeats R (default 3) each layout is measured and predicted R times, alternating, and the
medians compared.

  bench/plan_fidelity.py [--steps 8] [--warmup 2] [--repeats 3] [--layouts all|quick] [--tessel build/release/tessel]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/gpt2-tiny.yaml")

# (dp, tp, pp, vpp, sharding_stage, sp, micro_batches, schedule, recompute)
LAYOUTS = [
    (2, 1, 1, 1, 0, False, 1, "1F1B", "none"),
    (1, 2, 1, 1, 0, False, 1, "1F1B", "none"),
    (1, 2, 1, 1, 0, True, 1, "1F1B", "none"),
    (1, 1, 2, 1, 0, False, 4, "1F1B", "none"),
    (1, 1, 2, 1, 0, False, 4, "ZBH1", "none"),
    (1, 1, 2, 2, 0, False, 4, "VPP", "none"),
    (2, 1, 1, 1, 2, False, 1, "1F1B", "none"),
    (4, 1, 1, 1, 0, False, 1, "1F1B", "none"),
    (1, 4, 1, 1, 0, False, 1, "1F1B", "none"),
    (1, 1, 4, 1, 0, False, 4, "1F1B", "none"),
    (2, 2, 1, 1, 1, False, 1, "1F1B", "none"),
    (2, 1, 2, 1, 1, False, 4, "1F1B", "none"),
    (1, 2, 2, 1, 0, True, 4, "1F1B", "full"),
    (2, 2, 2, 1, 1, False, 4, "1F1B", "none"),
    (2, 2, 2, 1, 0, True, 4, "ZBH1", "none"),
    (8, 1, 1, 1, 0, False, 1, "1F1B", "none"),
]
QUICK = [LAYOUTS[i] for i in (0, 1, 3, 10, 13)]


def run(cmd, what):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {what} failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="training steps per layout (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="detect+plan+train rounds per layout (default 3)")
    ap.add_argument("--layouts", default="all", choices=["all", "quick"], help="all 16 layouts or 5 (default all)")
    ap.add_argument("--tessel", default=os.path.join(ROOT, "build/release/tessel"), help="the tessel binary")
    args = ap.parse_args()
    if not os.path.exists(args.tessel):
        sys.exit(f"error: {args.tessel} not found; build first (./run.sh build)")
    layouts = LAYOUTS if args.layouts == "all" else QUICK
    tmp = tempfile.mkdtemp(prefix="tessel-fidelity-")
    print(f"GPT-2 tiny ({CONFIG}), thread backend; median step time over steps {args.warmup}..{args.steps - 1}; "
          f"medians of {args.repeats} rounds")
    print(f"{'layout':<72} {'ranks':>5} {'predicted s':>12} {'measured s':>11} {'pred/meas':>10}")
    ratios = []
    for dp, tp, pp, vpp, stage, sp, mb, schedule, recompute in layouts:
        ranks = dp * tp * pp
        mbs = 16 // (dp * mb)
        layout = (f"dp={dp},tp={tp},pp={pp},vpp={vpp},mbs={mbs},sharding_stage={stage},sp={str(sp).lower()},"
                  f"recompute={recompute},schedule={schedule}")
        sets = [f"train.steps={args.steps}", "train.warmup=0", "train.save_every=0", f"parallel.dp={dp}",
                f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.vpp={vpp}", f"parallel.sharding_stage={stage}",
                f"parallel.sp={str(sp).lower()}", f"parallel.micro_batches={mb}", f"parallel.schedule={schedule}",
                f"parallel.recompute={recompute}"]
        predictions, measurements = [], []
        for _ in range(args.repeats):
            path = os.path.join(tmp, f"local-{ranks}.yaml")
            run([args.tessel, "cluster", "detect", "--ranks", str(ranks), "-q", "-o", path], "cluster detect")
            plan = json.loads(run([args.tessel, "plan", "--model", CONFIG, "--cluster", path, "--layout", layout,
                                   "--format", "json"], "tessel plan"))
            predictions.append(plan["plans"][0]["step_time_s"])
            metrics = os.path.join(tmp, "metrics.jsonl")
            cmd = [args.tessel, "train", CONFIG, "--metrics", metrics, "--nproc", str(ranks)]
            for s in sets:
                cmd += ["--set", s]
            run(cmd, "tessel train")
            with open(metrics) as f:
                steps = [json.loads(line) for line in f if line.strip()]
            measurements.append(statistics.median(s["step_time_s"] for s in steps[args.warmup:]))
        predicted, measured = statistics.median(predictions), statistics.median(measurements)
        ratios.append(predicted / measured)
        print(f"{layout:<72} {ranks:>5} {predicted:>12.4f} {measured:>11.4f} {predicted / measured:>9.2f}x", flush=True)
    within = sum(1 for r in ratios if abs(r - 1) <= 0.2)
    print(f"median predicted/measured {statistics.median(ratios):.2f}x; {within} of {len(ratios)} layouts within 20%")


if __name__ == "__main__":
    main()
