#!/usr/bin/env python3
"""Does DeepSpeed's pipeline schedule, with sends that wait for their receiver, cost more than 1F1B?

docs/plan.md ("What the errors show", MT-NLG) rests on this check. DeepSpeed's PipelineEngine
runs TrainSchedule (deepspeed/runtime/pipe/schedule.py): 2 * (micro_batches + stages - 1) steps,
in each of which a stage first exchanges with one neighbour (a forward step: SendGrad of its
previous backward's result, then RecvActivation; a backward step: RecvGrad, then SendActivation
of its previous forward's result) and then runs one forward or one backward. Stage s runs a
forward at step t when t and s have the same parity; the micro-batch ids follow the schedule's
_even/_odd_step_forward/backward_id arithmetic. The sends are blocking, so a send and its
receive start together when both stages reach them.

This plays every stage's instruction list in order under that rule (each send matched with the
receive it pairs with; a send of a result not yet computed is an error) and prints its makespan
beside the 1F1B one, (m + p - 1)(F + B). Plain Python; a second or so for p = 35.

  python3 scripts/deepspeed_schedule_check.py --stages 35 --micro-batches 240,192,160 --fwd 0.049 --bwd 0.147
"""
import argparse
from collections import deque


def instructions(stages, micro_batches, stage, fwd, bwd):
    def step_micro_batch(step):
        even_step, even_stage = step % 2 == 0, stage % 2 == 0
        if even_step == even_stage:  # a forward step
            return (step if even_step else step - 1) // 2 - stage // 2, True
        if even_step:  # an odd stage's backward
            return step // 2 - stages + (stage + 1) // 2, False
        return (step - 1) // 2 - stages + 1 + stage // 2, False

    def valid(k):
        return 0 <= k < micro_batches

    ops, prev = [], -1
    for step in range(2 * (micro_batches + stages - 1)):
        k, forward = step_micro_batch(step)
        if forward and stage > 0:
            if valid(prev):
                ops.append(("send", stage - 1, "grad", prev))
            if valid(k):
                ops.append(("recv", stage - 1, "act", k))
        if not forward and stage < stages - 1:
            if valid(k):
                ops.append(("recv", stage + 1, "grad", k))
            if valid(prev):
                ops.append(("send", stage + 1, "act", prev))
        if valid(k):
            ops.append(("compute", fwd if forward else bwd, "act" if forward else "grad", k))
        prev = k
    return ops


def play(stages, micro_batches, fwd, bwd, transfer=0.0):
    queues = [deque(instructions(stages, micro_batches, s, fwd, bwd)) for s in range(stages)]
    clock = [0.0] * stages
    computed = [{"act": set(), "grad": set()} for _ in range(stages)]
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while queues[s]:
                kind, a, tag, k = queues[s][0]
                if kind == "compute":
                    clock[s] += a
                    computed[s][tag].add(k)
                    queues[s].popleft()
                    moved = True
                    continue
                peer, other = a, ("recv" if kind == "send" else "send")
                head = queues[peer][0] if queues[peer] else None
                if head is None or head[:3] != (other, s, tag):
                    break
                if head[3] != k:
                    raise SystemExit(f"stage {s} {kind}s {tag} of micro-batch {k}, stage {peer} expects {head[3]}")
                sender = s if kind == "send" else peer
                if k not in computed[sender][tag]:
                    raise SystemExit(f"stage {sender} sends {tag} of micro-batch {k} before computing it")
                clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer
                queues[s].popleft()
                queues[peer].popleft()
                moved = True
    if any(queues):
        raise SystemExit("deadlock: " + ", ".join(f"stage {s} waits at {q[0]}" for s, q in enumerate(queues) if q))
    return max(clock)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=35)
    ap.add_argument("--micro-batches", default="240,192,160", help="comma-separated micro-batch counts per step")
    ap.add_argument("--fwd", type=float, default=1.0, help="one stage's forward of one micro-batch (seconds)")
    ap.add_argument("--bwd", type=float, default=3.0, help="one stage's backward, recompute included (seconds)")
    ap.add_argument("--transfer", type=float, default=0.0, help="seconds one send takes once both sides are there")
    args = ap.parse_args()
    if args.stages < 1 or args.fwd < 0 or args.bwd < 0 or args.transfer < 0:
        ap.error("--stages must be at least 1 and the times not negative")
    for m in (int(x) for x in args.micro_batches.split(",")):
        if m < 1:
            ap.error("--micro-batches must be positive")
        ds = play(args.stages, m, args.fwd, args.bwd, args.transfer)
        one_f_one_b = (m + args.stages - 1) * (args.fwd + args.bwd + 2 * args.transfer)
        print(f"stages {args.stages}, micro-batches {m}: DeepSpeed TrainSchedule {ds:.4f} s, "
              f"1F1B {one_f_one_b:.4f} s, ratio {ds / one_f_one_b:.4f}")


if __name__ == "__main__":
    main()
