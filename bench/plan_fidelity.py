#!/usr/bin/python3
"""Local fidelity of the planner: predicted step time beside the measured one for the hybrid
layouts tessel runs on this machine (GPT-2 tiny, thread backend, up to 8 ranks; and context
parallel on Llama tiny and expert parallel on Mixtral tiny).

One round of a layout: `tessel cluster detect --ranks N` measures the machine, `tessel train`
runs the layout, and detect measures again; `tessel plan --layout ... --format json` predicts
the step on each of the two measurements and the round's prediction is their mean. The measured
figure is the mean step time after the warm-up steps. A shared host can switch between a fast
and a slow speed every second or two, so both sides are time averages (a median would land on
one of the two speeds) and each round pairs a prediction with the measurement it brackets.

With --repeats R (default 3) every layout gets R rounds, the layouts taking turns so that a slow
minute falls on many of them a little rather than on one a lot; the table gives the medians of
the predictions, of the measurements and of the per-round ratios.

The `cpu` column is how busy the training run kept the cores it could use: the process's CPU
time (user + system) over wall time x min(ranks, cores), median of the rounds. With at least
as many ranks as cores a step leaves a core idle only while every rank on it waits, so a low
figure there mostly means the host took the cores away (a co-tenant or the hypervisor); read
such rows' ratios with that in mind. Startup and the warm-up steps are inside the figure.

The `steal` column is the share of the machine's CPU time the hypervisor gave to other guests
while the training ran (/proc/stat's steal counter over all counters; "-" where the kernel does
not report it), median of the rounds. Stolen time slows every step, and a layout whose ranks
meet in a collective many times a step (tensor parallelism) more than the detect's kernels
that predict it: a rank whose core is taken holds up its partners.

The memory columns compare the plan's per-rank memory (its fullest rank: parameters, gradients,
optimizer states and activations as the runtime holds them) with the highest mark any rank's
allocator reached during the run (the `rank N peak memory over the run: ... all X` lines the
trainer logs), medians of the rounds; the summary counts the layouts within 15% and lists the
ratio per ZeRO stage.

Mixture-of-experts rows start from a router trained --moe-router-steps steps (default 100, on
one rank, once per run of the bench; `tessel train --resume` then runs the layout). The planner
costs a router its balancing loss keeps even (tokens x top_k / experts rows per expert, times
the expected maximum of random routing); a freshly initialised router is not one: on Mixtral
tiny it sends one ep rank ~1.5x its share at step 2 (balancing loss 1.19; 1.03 after 25 steps,
1.01 after 100), so a run's first steps are a transient that no steady-state figure describes.
`--moe-router-steps 0` measures from initialisation, transient included.

  bench/plan_fidelity.py [--steps 12] [--warmup 2] [--repeats 3] [--layouts all|quick|I,J,...]
                         [--moe-router-steps 100] [--tessel build/release/tessel]
"""
import argparse
import json
import re
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/gpt2-tiny.yaml")

# (dp, tp, pp, vpp, sharding_stage, sp, micro_batches, schedule, recompute[, config, cp, cp_method, ep]):
# GPT-2 tiny unless a config is named.
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
    (2, 1, 1, 1, 3, False, 1, "1F1B", "none"),
    (4, 1, 1, 1, 3, False, 1, "1F1B", "none"),
    # Context parallel (Llama tiny) and expert parallel (Mixtral tiny): their blocks are traced too.
    (1, 1, 1, 1, 0, False, 1, "1F1B", "none", "llama-tiny", 2, "ring", 1),
    (2, 1, 1, 1, 0, False, 1, "1F1B", "none", "llama-tiny", 2, "all_to_all", 1),
    (1, 2, 1, 1, 0, True, 1, "1F1B", "none", "llama-tiny", 2, "ring", 1),
    (1, 1, 1, 1, 0, False, 1, "1F1B", "none", "mixtral-tiny", 1, "ring", 2),
    (2, 1, 1, 1, 1, False, 1, "1F1B", "none", "mixtral-tiny", 1, "ring", 2),
    # A mixture of experts over long sequences: the experts over ep, each sequence over cp.
    (1, 1, 1, 1, 0, False, 1, "1F1B", "none", "mixtral-tiny", 2, "ring", 2),
]


def full(spec):
    """A layout with its config, cp, cp_method and ep (GPT-2 tiny, 1, ring, 1 where not given)."""
    return tuple(spec) + ("gpt2-tiny", 1, "ring", 1)[len(spec) - 9:] if len(spec) < 13 else tuple(spec)


def config_of(spec):
    return os.path.join(ROOT, f"configs/{full(spec)[9]}.yaml")


def ranks_of(spec):
    dp, tp, pp = spec[:3]
    cp, ep = full(spec)[10], full(spec)[12]
    return dp * tp * pp * cp * ep
QUICK = [LAYOUTS[i] for i in (0, 1, 3, 10, 13)]


def run(cmd, what, want_stderr=False):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {what} failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    return (out.stdout, out.stderr) if want_stderr else out.stdout


UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def measured_peak_bytes(log):
    """The highest 'all' mark of the ranks' `peak memory over the run` lines."""
    peaks = [float(v) * UNITS[u] for v, u in re.findall(r"peak memory over the run: .* all ([0-9.]+) ([KMG]iB)", log)]
    if not peaks:
        sys.exit("error: tessel train logged no `peak memory over the run` line")
    return max(peaks)


def cpu_times():
    """The machine's aggregate CPU counters (user .. steal) from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    return [int(x) for x in fields[1:9]]


def steal_share(before, after):
    if before is None or after is None:
        return None
    delta = [b - a for a, b in zip(before, after)]
    return delta[7] / sum(delta) if sum(delta) > 0 else None


def percent(share):
    return "-" if share is None else f"{100 * share:.0f}%"


def layout_text(*spec):
    dp, tp, pp, vpp, stage, sp, mb, schedule, recompute, _, cp, cp_method, ep = full(spec)
    mbs = 16 // (dp * ep * mb)
    text = (f"dp={dp},tp={tp},pp={pp},vpp={vpp},mbs={mbs},sharding_stage={stage},sp={str(sp).lower()},"
            f"recompute={recompute},schedule={schedule}")
    if ep > 1:
        text += f",ep={ep}"
    if cp > 1:
        text += f",cp={cp},cp_method={cp_method}"
    return text


def label(spec):
    """The layout as the table shows it: the model where it is not GPT-2 tiny."""
    model = full(spec)[9]
    return layout_text(*spec) + ("" if model == "gpt2-tiny" else f" [{model}]")


def predict(args, cluster, layout, config):
    """(step time in s, memory of the fullest rank in bytes) the planner predicts."""
    plan = json.loads(run([args.tessel, "plan", "--model", config, "--cluster", cluster, "--layout", layout,
                           "--format", "json"], "tessel plan"))
    best = plan["plans"][0]
    return best["step_time_s"], best["memory_gb"]["total"] * 1e9


def trained_router(args, tmp, config):
    """A checkpoint of `config` trained --moe-router-steps steps on one rank (made once), or None."""
    steps = args.moe_router_steps
    if steps <= 0:
        return None
    folder = os.path.join(tmp, "router-" + os.path.basename(config).removesuffix(".yaml"))
    step = os.path.join(folder, f"step-{steps:06d}")
    if not os.path.isdir(step):
        print(f"training {os.path.basename(config)}'s router {steps} steps for its rows", file=sys.stderr, flush=True)
        run([args.tessel, "train", config, "--save", folder, "--set", f"train.steps={steps}",
             "--set", f"train.save_every={steps}"], "tessel train (the router's warm-up)")
    return step


def one_round(args, tmp, spec):
    """Detect, train, detect: the mean of the two predictions and the mean measured step time."""
    dp, tp, pp, vpp, stage, sp, mb, schedule, recompute, _, cp, cp_method, ep = full(spec)
    ranks = ranks_of(spec)
    layout = layout_text(*spec)
    config = config_of(spec)
    predictions = []

    def detect_and_predict():
        path = os.path.join(tmp, f"local-{ranks}.yaml")
        run([args.tessel, "cluster", "detect", "--ranks", str(ranks), "-q", "-o", path], "cluster detect")
        predictions.append(predict(args, path, layout, config))

    detect_and_predict()
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.tessel, "train", config, "--metrics", metrics, "--nproc", str(ranks)]
    start = trained_router(args, tmp, config) if "mixtral" in os.path.basename(config) else None
    first = args.moe_router_steps if start else 0
    if start:
        cmd += ["--resume", start]
    sets = [f"train.steps={first + args.steps}", "train.warmup=0", "train.save_every=0", f"parallel.dp={dp}",
            f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.vpp={vpp}", f"parallel.sharding_stage={stage}",
            f"parallel.sp={str(sp).lower()}", f"parallel.micro_batches={mb}", f"parallel.schedule={schedule}",
            f"parallel.recompute={recompute}", f"parallel.ep={ep}", f"parallel.cp={cp}"]
    if cp > 1:
        sets.append(f"parallel.cp_method={cp_method}")
    for s in sets:
        cmd += ["--set", s]
    before, t0, stat0 = os.times(), time.monotonic(), cpu_times()
    _, log = run(cmd, "tessel train", want_stderr=True)
    memory = measured_peak_bytes(log)
    after, wall, stat1 = os.times(), time.monotonic() - t0, cpu_times()
    steal = steal_share(stat0, stat1)
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    busy = cpu / (wall * min(ranks, os.cpu_count() or 1))
    with open(metrics) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    steps = [s for s in steps if "step_time_s" in s and s.get("step", 0) >= first]
    measured = statistics.mean(s["step_time_s"] for s in steps[args.warmup:])
    detect_and_predict()
    return (statistics.mean(p for p, _ in predictions), measured, busy, steal,
            statistics.mean(m for _, m in predictions), memory)


def choose_layouts(text):
    if text == "all":
        return LAYOUTS
    if text == "quick":
        return QUICK
    try:
        picked = [int(i) for i in text.split(",")]
    except ValueError:
        sys.exit(f"error: --layouts takes all, quick or comma-separated indices 0..{len(LAYOUTS) - 1}; got '{text}'")
    for i in picked:
        if not 0 <= i < len(LAYOUTS):
            sys.exit(f"error: --layouts index {i} is not in 0..{len(LAYOUTS) - 1}; the layouts are:\n" +
                     "\n".join(f"  {j}: {label(spec)}" for j, spec in enumerate(LAYOUTS)))
    return [LAYOUTS[i] for i in dict.fromkeys(picked)]  # a repeated index runs once


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="training steps per round (default 12)")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the mean (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per layout (default 3)")
    ap.add_argument("--layouts", default="all",
                    help=f"all (the {len(LAYOUTS)} layouts), quick (5 of them) or comma-separated indices into them "
                         "(default all)")
    ap.add_argument("--moe-router-steps", type=int, default=100,
                    help="mixture-of-experts rows start from a router trained this many steps (0: from "
                         "initialisation; default 100)")
    ap.add_argument("--tessel", default=os.path.join(ROOT, "build/release/tessel"), help="the tessel binary")
    args = ap.parse_args()
    if not os.path.exists(args.tessel):
        sys.exit(f"error: {args.tessel} not found; build first (./run.sh build)")
    if args.steps <= args.warmup:
        sys.exit(f"error: --steps {args.steps} must exceed --warmup {args.warmup}")
    layouts = choose_layouts(args.layouts)
    tmp = tempfile.mkdtemp(prefix="tessel-fidelity-")
    rounds = {spec: [] for spec in layouts}
    total = args.repeats * len(layouts)
    for r in range(args.repeats):
        for i, spec in enumerate(layouts):
            predicted, measured, busy, steal, mem_pred, mem_meas = one_round(args, tmp, spec)
            rounds[spec].append((predicted, measured, busy, steal, mem_pred, mem_meas))
            done = r * len(layouts) + i + 1
            print(f"[{done}/{total}] {label(spec)}: predicted {predicted:.4f} s, measured {measured:.4f} s, "
                  f"memory {mem_pred / 2**20:.1f} vs {mem_meas / 2**20:.1f} MiB, cpu {100 * busy:.0f}%, "
                  f"steal {percent(steal)}", file=sys.stderr, flush=True)
    print(f"GPT-2 tiny ({CONFIG}) unless named, thread backend; mean step time over steps {args.warmup}..{args.steps - 1}; "
          f"medians of {args.repeats} rounds")
    print(f"{'layout':<86} {'ranks':>5} {'predicted s':>12} {'measured s':>11} {'pred/meas':>10} {'range':>11} {'cpu':>5} "
          f"{'steal':>6} {'mem pred MiB':>13} {'mem meas MiB':>13} {'mem ratio':>10}")
    ratios, mem_ratios, by_stage = [], [], {}
    for spec in layouts:
        per_round = [p / m for p, m, *_ in rounds[spec]]
        predicted = statistics.median(p for p, *_ in rounds[spec])
        measured = statistics.median(r[1] for r in rounds[spec])
        busy = statistics.median(r[2] for r in rounds[spec])
        mem_pred = statistics.median(r[4] for r in rounds[spec])
        mem_meas = statistics.median(r[5] for r in rounds[spec])
        mem_ratios.append(mem_pred / mem_meas)
        by_stage.setdefault(spec[4], []).append(mem_pred / mem_meas)
        steals = [r[3] for r in rounds[spec] if r[3] is not None]
        steal = statistics.median(steals) if steals else None
        ratio = statistics.median(per_round)
        ratios.append(ratio)
        spread = f"{min(per_round):.2f}-{max(per_round):.2f}"
        print(f"{label(spec):<86} {ranks_of(spec):>5} {predicted:>12.4f} {measured:>11.4f} {ratio:>9.2f}x "
              f"{spread:>11} {100 * busy:>4.0f}% {percent(steal):>6} {mem_pred / 2**20:>13.1f} {mem_meas / 2**20:>13.1f} "
              f"{mem_pred / mem_meas:>9.2f}x")
    within = sum(1 for r in ratios if abs(r - 1) <= 0.2)
    within15 = sum(1 for r in ratios if abs(r - 1) <= 0.15)
    print(f"median predicted/measured {statistics.median(ratios):.2f}x; {within} of {len(ratios)} layouts within 20%, "
          f"{within15} within 15%")
    if args.moe_router_steps > 0 and any("mixtral" in full(s)[9] for s in layouts):
        print(f"mixture-of-experts rows: from a router trained {args.moe_router_steps} steps "
              "(--moe-router-steps 0 measures from initialisation)")
    mem_within = sum(1 for r in mem_ratios if abs(r - 1) <= 0.15)
    stages = ", ".join(f"stage {st}: {min(v):.2f}-{max(v):.2f}x" for st, v in sorted(by_stage.items()))
    print(f"memory: predicted/measured peak per rank, {mem_within} of {len(mem_ratios)} layouts within 15% ({stages})")


if __name__ == "__main__":
    main()
