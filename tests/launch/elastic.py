#!/usr/bin/env python3
"""Elastic training: lose a node, go on with the ranks left, grow back. Two `tessel launch
--nnodes 1:2` launchers on this machine play two nodes of two Gloo processes each (a 4-rank
dp2·tp2 ZeRO-2 job with a checkpoint in memory every step and on disk every 5). RUNS times, a random step of
the job:
  - node: node 1's launcher is killed with SIGKILL (its processes die with it): node 0 must go
    on alone — a round of 2 ranks, a layout the planner chose for them, the global batch kept —
    from the newest complete checkpoint, which is in memory unless the step is a disk one or the
    one right after it (see at_step below); then node 1 is started again and the job must grow
    back to 4 ranks at a checkpoint;
  - rank: one random process is killed with SIGKILL: the next round restarts it on the same
    nodes.
Each time both launchers must exit 0 and the metrics file must hold every step once with the
losses of an uninterrupted 4-rank job (relative 1e-5). Prints detection (kill to the
launcher's report) and recovery (kill to the next completed step) times, and the time the
job took to grow back.
  elastic.py TESSEL_BINARY SOURCE_DIR [RUNS]
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from train_job import Node, free_port, losses, rejoin, train_command, uninterrupted_losses, workers

tessel, src = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 4
steps = 24
rng = random.Random(5)
token = "e1a571c0e1a571c0e1a571c0e1a571c0"
train = train_command(tessel, src, steps, save_every=5)


def node(work, rank, port, name):
    return Node(tessel, token, [*train, "--save", os.path.join(work, "ck"), "--metrics", os.path.join(work, "m.jsonl")],
                rank, port, name)


def step_line(step):
    return lambda l: l.startswith("[rank 0]") and f"info: step {step}/{steps}" in l


with tempfile.TemporaryDirectory() as tmp:
    want = uninterrupted_losses(tessel, train, tmp, steps)

    detections, recoveries, grows = [], [], []
    for run in range(runs):
        what = "node" if run % 2 == 0 else "rank"
        work = os.path.join(tmp, f"run{run}")
        os.makedirs(work)
        port = free_port()
        # The in-memory copy of step k is taken right after rank 0 logs step k, and is skipped while
        # a disk save (every 5 steps, written in the background) is still being written. So a kill
        # just after step 5k + 1's line can find memory's newest whole step older than the disk's
        # (the copy of 5k + 1 is under way, 5k's went to disk): a node is lost at a step whose
        # previous step's copy was surely taken (3, 4, 8, 9), a rank at any step from 2 to 7.
        at_step = rng.choice([3, 4, 8, 9]) if what == "node" else rng.randrange(2, 8)
        n0 = node(work, 0, port, "node 0")
        time.sleep(0.2)
        n1 = node(work, 1, port, "node 1")
        nodes = [n0, n1]
        logs = lambda: "".join(n.text() for n in nodes)
        i = n0.wait_line(step_line(at_step))
        if i is None:
            sys.exit(f"run {run}: step {at_step} never came\n{logs()}")
        if what == "node":
            n1.p.kill()
        else:
            victim = rng.choice(workers(rng.choice(nodes).p.pid))
            os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        j = n0.wait_line(lambda l: l.startswith("tessel launch: ") and "stopping the job" in l, i)
        k = n0.wait_line(lambda l: l.startswith("[rank 0]") and "info: step " in l, j if j is not None else i)
        if j is None or k is None:
            sys.exit(f"run {run}: the {what} kill at step {at_step} was not detected and recovered from\n{logs()}")
        detected, recovered = n0.lines[j][0] - killed, n0.lines[k][0] - killed
        if at_step % 5 not in (0, 1) and n0.wait_line(lambda l: "resuming from the in-memory checkpoint" in l, j) is None:
            sys.exit(f"run {run}: the recovery did not resume from memory\n{logs()}")
        round_line = n0.wait_line(lambda l: "tessel launch: round 1:" in l, j)
        expect = "1 node " if what == "node" else "2 nodes "
        if round_line is None or expect not in n0.lines[round_line][1]:
            sys.exit(f"run {run}: round 1 should run on {expect.strip()}\n{logs()}")
        grown = None
        if what == "node":
            n1.p.wait()
            again, rejoined = rejoin(n0, lambda: node(work, 1, port, "node 1 again"))
            nodes.append(again)
            g = n0.wait_line(lambda l: "tessel launch: round 2: 2 nodes" in l, k)
            if g is None:
                sys.exit(f"run {run}: the job did not grow back to 2 nodes\n{logs()}")
            s = n0.wait_line(lambda l: l.startswith("[rank 0]") and "info: step " in l, g)
            grown = (n0.lines[s][0] if s is not None else time.monotonic()) - rejoined
        for n in nodes[:1] + nodes[2:] + ([n1] if what == "rank" else []):
            if n.p.wait(timeout=180) != 0:
                sys.exit(f"run {run}: {n.name}'s launcher exited {n.p.returncode}\n{logs()}")
        got = losses(os.path.join(work, "m.jsonl"))
        if sorted(got) != list(range(steps)):
            sys.exit(f"run {run}: the metrics file holds steps {sorted(got)}\n{logs()}")
        for st, l in want.items():
            if abs(got[st] - l) > 1e-5 * abs(l):
                sys.exit(f"run {run}: step {st} loss {got[st]} vs {l} uninterrupted\n{logs()}")
        if os.environ.get("ELASTIC_VERBOSE"):
            print(logs())
        detections.append(detected)
        recoveries.append(recovered)
        msg = (f"run {run}: SIGKILL of a {what} at step {at_step}: detected in {detected:.2f} s, next step done "
               f"{recovered:.2f} s after the kill on {'2' if what == 'node' else '4'} ranks")
        if grown is not None:
            grows.append(grown)
            msg += f"; grew back to 4 ranks {grown:.2f} s after node 1 started again"
        print(msg + f"; all {steps} steps match")
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"elastic: ok ({runs} runs; detection median {med(detections):.2f} s, max {max(detections):.2f} s; recovery "
          f"median {med(recoveries):.2f} s, max {max(recoveries):.2f} s; grow median {med(grows):.2f} s)")
