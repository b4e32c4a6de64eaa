#!/usr/bin/env python3
"""Elastic training that recovers from a peer machine's memory. Two `tessel launch --nnodes 1:2`
launchers on this machine play two machines of two Gloo processes each, and each has its own
memory folder (`train.memory_dir`), as each machine has its own tmpfs: a checkpoint goes to
memory every step — each machine keeping its own ranks' pieces and a peer copy of the other's —
and to disk only every 10 steps. RUNS times, node 1's launcher is killed (SIGKILL, its processes
die with it) at a random step after the disk checkpoint of step 10 is out: node 0 must go on alone from
the newest step in its memory, which holds node 1's pieces only as peer copies (the log must say
so), newer than the disk's; then node 1 starts again (its memory folder stale; node 0's round
holds still until it waits to join) and the job grows back to 4 ranks. Both launchers must exit 0 and the metrics file must hold every step once with
the losses of an uninterrupted 4-rank job (relative 1e-5). Prints detection (kill to the
launcher's report) and recovery (kill to the next completed step) times.
  elastic_peer.py TESSEL_BINARY SOURCE_DIR [RUNS]
"""
import os
import random
import re
import subprocess
import sys
import tempfile
import time

from train_job import Node, free_port, losses, rejoin, train_command, uninterrupted_losses

tessel, src = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
steps, disk_every = 40, 10
rng = random.Random(26)
token = "9ee12c0b9ee12c0b9ee12c0b9ee12c0b"
train = train_command(tessel, src, steps, save_every=disk_every)


def node(work, rank, port, name):
    return Node(tessel, token, [*train, "--set", f"train.memory_dir={os.path.join(work, f'mem{rank}')}",
                                "--save", os.path.join(work, "ck"), "--metrics", os.path.join(work, "m.jsonl")],
                rank, port, name)


with tempfile.TemporaryDirectory() as tmp:
    want = uninterrupted_losses(tessel, train, tmp, steps)

    detections, recoveries = [], []
    for run in range(runs):
        work = os.path.join(tmp, f"run{run}")
        os.makedirs(work)
        port = free_port()
        at_step = rng.randrange(disk_every + 2, 2 * disk_every - 1)
        n0 = node(work, 0, port, "node 0")
        time.sleep(0.2)
        n1 = node(work, 1, port, "node 1")
        nodes = [n0, n1]
        logs = lambda: "".join(n.text() for n in nodes)
        # The disk checkpoint of step 10 is written in the background and published a few steps
        # later (memory saves wait for it): kill only once it is out and a memory step after it is
        # written (the memory save at a step boundary comes before the next step's line).
        saved = n0.wait_line(lambda l: f"saved {os.path.join(work, 'ck', 'step-0000' + str(disk_every))}" in l)
        if saved is None:
            sys.exit(f"run {run}: the disk checkpoint of step {disk_every} never came\n{logs()}")
        i = n0.wait_line(lambda l: l.startswith("[rank 0]") and (m := re.search(r"info: step (\d+)/", l)) is not None
                         and int(m.group(1)) >= at_step, saved)
        if i is None:
            sys.exit(f"run {run}: step {at_step} never came\n{logs()}")
        at_step = int(re.search(r"info: step (\d+)/", n0.lines[i][1]).group(1))
        n1.p.kill()
        killed = time.monotonic()
        j = n0.wait_line(lambda l: l.startswith("tessel launch: ") and "stopping the job" in l, i)
        k = n0.wait_line(lambda l: l.startswith("[rank 0]") and "info: step " in l, j if j is not None else i)
        if j is None or k is None:
            sys.exit(f"run {run}: the loss of node 1 at step {at_step} was not detected and recovered from\n{logs()}")
        # Node 1 starts again at once; node 0's round holds still until it waits to join.
        n1.p.wait()
        again, rejoined = rejoin(n0, lambda: node(work, 1, port, "node 1 again"))
        nodes.append(again)
        detected, recovered = n0.lines[j][0] - killed, n0.lines[k][0] - killed
        # Node 0 alone holds node 1's pieces (saving ranks 2 and 3) only as peer copies.
        held = n0.wait_line(lambda l: "is held whole by the 1 machine left" in l and
                            "peer copies of saving ranks 2,3" in l, j)
        mem = os.path.join(work, "mem0")
        r = n0.wait_line(lambda l: "resuming from the in-memory checkpoint " + mem in l, j)
        resumed = n0.wait_line(lambda l: "resumed from " + mem in l, j)
        if held is None or r is None or resumed is None:
            sys.exit(f"run {run}: node 0 did not resume from its peer copies in memory\n{logs()}")
        if n0.wait_line(lambda l: "on each of 2 machines" in l) is None:
            sys.exit(f"run {run}: the job did not keep in-memory checkpoints on each machine\n{logs()}")
        from_step = int(re.search(r"at step (\d+)", n0.lines[resumed][1]).group(1))
        if from_step <= disk_every:
            sys.exit(f"run {run}: resumed at step {from_step}, not newer than the disk's step {disk_every}\n{logs()}")
        if n0.wait_line(lambda l: "tessel launch: round 1: 1 node " in l, j) is None:
            sys.exit(f"run {run}: round 1 should run on node 0 alone\n{logs()}")
        g = n0.wait_line(lambda l: "tessel launch: round 2: 2 nodes" in l, k)
        if g is None:
            sys.exit(f"run {run}: the job did not grow back to 2 nodes\n{logs()}")
        s = n0.wait_line(lambda l: l.startswith("[rank 0]") and "info: step " in l, g)
        grown = (n0.lines[s][0] if s is not None else time.monotonic()) - rejoined
        for n in (n0, nodes[2]):
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
        grow_from = n0.wait_line(lambda l: "resumed from " in l, g)
        grow_note = n0.lines[grow_from][1].split("info: ")[-1].strip() if grow_from is not None else "?"
        detections.append(detected)
        recoveries.append(recovered)
        print(f"run {run}: SIGKILL of node 1 at step {at_step}: detected in {detected:.2f} s, node 0 resumed at step "
              f"{from_step} from its peer copies in memory (disk: step {disk_every}), next step done {recovered:.2f} s "
              f"after the kill; grew back to 4 ranks {grown:.2f} s after node 1 started again ({grow_note}); all "
              f"{steps} steps match")
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"elastic_peer: ok ({runs} runs; detection median {med(detections):.2f} s, max {max(detections):.2f} s; "
          f"recovery median {med(recoveries):.2f} s, max {max(recoveries):.2f} s)")
