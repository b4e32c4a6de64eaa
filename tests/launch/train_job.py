"""What the launch scripts (kill_rank.py, elastic.py) share: the small 4-rank Gloo training job
they interrupt (GPT-2, dp2·tp2, ZeRO-2, a checkpoint in memory every step), the losses its
metrics file holds, and a launcher's worker processes."""
import json
import os
import subprocess
import sys


def train_command(tessel, src, steps, save_every):
    """`tessel train` of the job: GPT-2 2x64 on 4 Gloo ranks, saving to disk every `save_every`
    steps and to memory every step."""
    return [tessel, "train", os.path.join(src, "configs", "gpt2-tiny.yaml"), "--backend", "gloo",
            "--set", "model.n_layer=2", "--set", "model.n_embd=64", "--set", "model.n_head=4",
            "--set", "train.seq_len=32", "--set", "train.global_batch=8", "--set", "train.micro_batch=8",
            "--set", f"train.steps={steps}", "--set", "train.warmup=0", "--set", f"train.save_every={save_every}",
            "--set", "train.memory_save_every=1", "--set", "train.threads=1", "--set", "log.every=1",
            "--set", "parallel.dp=2", "--set", "parallel.tp=2", "--set", "parallel.sharding_stage=2"]


def losses(path):
    """step -> loss of a metrics file; exits when a step appears twice."""
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r["step"] in out:
            sys.exit(f"{path}: step {r['step']} appears twice")
        out[r["step"]] = r["loss"]
    return out


def workers(launcher_pid):
    """The pids of a launcher's processes."""
    out = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]
