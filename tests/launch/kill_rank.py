#!/usr/bin/env python3
"""Kill -9 a rank, keep training: a 4-process Gloo job (dp2·tp2, ZeRO-2, a checkpoint in memory
every step and one on disk, written in the background, every third) under `tessel launch --max-restarts`, whose random rank is
killed with SIGKILL at a random step, RUNS times, and once stopped with SIGSTOP (a hung rank,
caught by its heartbeat). Every time the job must finish by itself (exit 0) with the lost rank
restarted, and its metrics file must hold every step once with the losses of an uninterrupted
run (relative 1e-5). Prints the detection time (kill to the launcher's report) and the recovery
time (kill to the next completed step) of each; the launcher gives its processes --kill-grace 1 s
to stop after a failure.
  kill_rank.py TESSEL_BINARY SOURCE_DIR [RUNS]
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

from train_job import losses, train_command, workers

tessel, src = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 10
steps = 8
rng = random.Random(11)
train = train_command(tessel, src, steps, save_every=3)


def launch(work, extra_launch=()):
    return subprocess.Popen([tessel, "launch", "--nproc-per-node", "4", "--timeout", "5", *extra_launch, "--", *train,
                             "--save", os.path.join(work, "ck"), "--metrics", os.path.join(work, "m.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)


with tempfile.TemporaryDirectory() as tmp:
    base = os.path.join(tmp, "base")
    os.makedirs(base)
    p = launch(base)
    err = p.stderr.read()
    if p.wait() != 0:
        sys.exit(f"the uninterrupted job failed:\n{err}")
    want = losses(os.path.join(base, "m.jsonl"))
    if sorted(want) != list(range(steps)):
        sys.exit(f"the uninterrupted job logged steps {sorted(want)}")

    detections, recoveries, sources = [], [], []
    for run in range(runs + 1):
        how = signal.SIGSTOP if run == runs else signal.SIGKILL
        work = os.path.join(tmp, f"run{run}")
        os.makedirs(work)
        at_step = rng.randrange(2, steps - 1)
        p = launch(work, ["--max-restarts", "2", "--kill-grace", "1"])
        log, killed, detected, recovered = [], None, None, None
        victim = None
        for line in p.stderr:
            now = time.monotonic()
            log.append(f"{now:.3f} {line}")
            if killed is None and f"info: step {at_step}/{steps}" in line and line.startswith("[rank 0]"):
                pids = workers(p.pid)
                victim = rng.choice(pids)
                os.kill(victim, how)
                killed = now
            elif killed is not None and detected is None and line.startswith("tessel launch: ") and "stopping the job" in line:
                detected = now
            elif detected is not None and recovered is None and "info: step " in line and "[rank 0]" in line:
                recovered = now
        rc = p.wait()
        text = "".join(log)
        if rc != 0:
            sys.exit(f"run {run}: the job exited {rc} after {how.name} of a rank at step {at_step}:\n{text}")
        if killed is None or detected is None or recovered is None:
            sys.exit(f"run {run}: the kill at step {at_step} was not seen, detected and recovered from:\n{text}")
        got = losses(os.path.join(work, "m.jsonl"))
        if sorted(got) != list(range(steps)):
            sys.exit(f"run {run}: the metrics file holds steps {sorted(got)}\n{text}")
        for s, l in want.items():
            if abs(got[s] - l) > 1e-5 * abs(l):
                sys.exit(f"run {run}: step {s} loss {got[s]} vs {l} uninterrupted\n{text}")
        detections.append(detected - killed)
        recoveries.append(recovered - killed)
        if os.environ.get("KILL_RANK_VERBOSE"): print(text)
        source = "memory" if "resuming from the in-memory checkpoint" in text else "disk"
        sources.append(source)
        print(f"run {run}: {how.name} of a rank (pid {victim}) at step {at_step}: detected in {detected - killed:.2f} s, "
              f"next step done {recovered - killed:.2f} s after the kill (resumed from {source}); all {steps} steps "
              f"match")
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"kill a rank, keep training: ok ({runs} SIGKILLs and one SIGSTOP; detection median {med(detections[:-1]):.2f} s, "
          f"max {max(detections[:-1]):.2f} s, SIGSTOP {detections[-1]:.2f} s; recovery median {med(recoveries[:-1]):.2f} s, "
          f"max {max(recoveries):.2f} s; {sources.count('memory')} of {len(sources)} recoveries from memory)")
    if "memory" not in sources:
        sys.exit("no recovery came from the in-memory checkpoint")
