"""What the launch scripts (kill_rank.py, elastic.py, elastic_peer.py) share: the small 4-rank
Gloo training job they interrupt (GPT-2, dp2·tp2, ZeRO-2, a checkpoint in memory every step), the
losses its metrics file holds, a launcher's worker processes, and an elastic node (a launcher
whose log lines are collected)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def train_command(tessel, src, steps, save_every):
    """`tessel train` of the job: GPT-2 2x64 on 4 Gloo ranks, saving to disk every `save_every`
    steps and to memory every step."""
    return [tessel, "train", os.path.join(src, "configs", "gpt2-tiny.yaml"), "--backend", "gloo",
            "--set", "model.n_layer=2", "--set", "model.n_embd=64", "--set", "model.n_head=4",
            "--set", "train.seq_len=32", "--set", "train.global_batch=8", "--set", "train.micro_batch=8",
            "--set", f"train.steps={steps}", "--set", "train.warmup=0", "--set", f"train.save_every={save_every}",
            "--set", "train.memory_save_every=1", "--set", "train.threads=1", "--set", "log.every=1",
            "--set", "parallel.dp=2", "--set", "parallel.tp=2", "--set", "parallel.sharding_stage=2",
            # TESSEL_TEST_DEVICE=guarded: the same job on the guarded test device (docs/devices.md).
            "--set", f"train.device={os.environ.get('TESSEL_TEST_DEVICE', 'cpu')}"]


def losses(path):
    """step -> loss of a metrics file; exits when a step appears twice."""
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r["step"] in out:
            sys.exit(f"{path}: step {r['step']} appears twice")
        out[r["step"]] = r["loss"]
    return out


def uninterrupted_losses(tessel, train, tmp, steps, nproc=4):
    """The losses of `train` run once without faults by one launcher of `nproc` processes (the
    oracle every recovery is checked against); exits naming what went wrong."""
    base = os.path.join(tmp, "base")
    os.makedirs(base)
    p = subprocess.run([tessel, "launch", "--nproc-per-node", str(nproc), "--", *train, "--save",
                        os.path.join(base, "ck"), "--metrics", os.path.join(base, "m.jsonl")],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"the uninterrupted job failed:\n{p.stderr}")
    want = losses(os.path.join(base, "m.jsonl"))
    if sorted(want) != list(range(steps)):
        sys.exit(f"the uninterrupted job logged steps {sorted(want)}")
    return want


def workers(launcher_pid):
    """The pids of a launcher's processes."""
    out = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One `tessel launch --nnodes 1:2` launcher of 2 processes running `command`; its stderr
    lines are collected with their arrival times."""

    def __init__(self, tessel, token, command, rank, port, name):
        env = dict(os.environ, TESSEL_JOB_TOKEN=token)
        self.p = subprocess.Popen([tessel, "launch", "--nnodes", "1:2", "--node-rank", str(rank), "--master",
                                   f"127.0.0.1:{port}", "--nproc-per-node", "2", "--max-restarts", "3", "--timeout", "5",
                                   "--kill-grace", "1", "--last-call", "1", "--", *command],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1, env=env)
        self.name, self.lines, self.cv = name, [], threading.Condition()
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()

    def read(self):
        for line in self.p.stderr:
            with self.cv:
                self.lines.append((time.monotonic(), line))
                self.cv.notify_all()

    def wait_line(self, pred, start=0, timeout=120):
        """Index of the first line from `start` on that satisfies pred."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for i in range(start, len(self.lines)):
                    if pred(self.lines[i][1]):
                        return i
                if self.p.poll() is not None and not self.t.is_alive():
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(min(left, 0.2))

    def text(self):
        return "".join(f"{t:.3f} [{self.name}] {l}" for t, l in self.lines)


def rejoin(n0, start_node, hold=1.0):
    """Starts a node again (`start_node()` returns it) while the round node 0 runs alone holds
    still: node 0's worker processes are stopped (SIGSTOP) until node 0's launcher has seen the
    newcomer and asked them to stop at a checkpoint (it continues stopped workers itself when it
    stops them), at most `hold` seconds, then continued. Without the pause the round's last
    steps (a few ms each) can end the job before node 0's launcher polls the newcomer in (every
    100 ms), and the job rightly finishes on one node. The hold stays below what the launcher's
    heartbeat watch allows a silent worker (2.5 s at the scripts' --timeout 5): past it, the
    round goes on and the scripts' 40- and 24-step jobs leave it time to see the newcomer.
    Returns the new node and the time it was started."""
    held = workers(n0.p.pid)
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        again = start_node()
        started = time.monotonic()
        n0.wait_line(lambda l: "membership change:" in l, len(n0.lines), timeout=hold)
    finally:
        for pid in held:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    return again, started
