"""DeepSpeed's pipeline schedule on MT-NLG's shape, with its blocking sends, against the price.

    .venv/bin/python -m benchmarks.deepspeed_pipe

MT-NLG 530B ran DeepSpeed's pipeline engine (tensor 8 x pipeline 35, 160 microbatches of one
sequence). This replays the order of instructions of that engine's ``TrainSchedule`` (microsoft/
DeepSpeed, deepspeed/runtime/pipe/schedule.py at e2fdd254e, 2021-09-29: each step a stage either
runs a forward or a backward, after exchanging with one neighbour) with its sends and receives
blocking (p2p.py ``send``/``recv``: ``dist.send``/``dist.recv``, a transfer starts when both ends
have reached it and holds both until it ends), and what its engine adds per microbatch
(engine.py: each tensor rank sends its 1/8 slice and a meta tensor, ``PartitionedTensor.full``
all-gathers it over NVLink plus zero and clone passes, a middle stage re-gathers its own output
before the backward). It prints the step beside ``(m + p - 1)`` times the slowest stage with the
cut the planner prices (``planning/step_price.cut_times``: per microbatch two sends of the slice
and two all-gathers), so the engine's communication can be told from the rest of MT-NLG's gap.
"""

from __future__ import annotations

P, M = 35, 160  # stages, microbatches per pipeline
HIDDEN, SEQ, TENSOR, VOCAB = 20480, 2048, 8, 51200
NVLINK, IB, HBM, LAT = 200e9, 22.5e9, 2.039e12 * 0.8, 7e-6  # the dgxa100 preset: bytes/s, s
FORWARD, BACKWARD = 40.9e-3, 122.7e-3  # a 3-layer stage's priced 164 ms, forward : recompute + backward = 1 : 3
HEAD = 2 * SEQ * HIDDEN * (VOCAB / TENSOR) / (312e12 * 0.869)  # the last stage's LM head, forward


def _step(s: int, stage: int, p: int) -> tuple[int, bool]:
    """(microbatch, is forward) of step ``s`` on ``stage``: TrainSchedule._step_to_micro_batch."""
    if s % 2 == 0 and stage % 2 == 0:
        return s // 2 - stage // 2, True
    if s % 2 == 1 and stage % 2 == 1:
        return (s - 1) // 2 - stage // 2, True
    if s % 2 == 0:
        return s // 2 - p + (stage + 1) // 2, False
    return (s - 1) // 2 - p + 1 + stage // 2, False


def program(stage: int, p: int, m: int) -> list[tuple]:
    """One stage's instructions in TrainSchedule.steps' order."""
    ops, prev = [], -1
    for s in range(2 * (m + p - 1)):
        k, fwd = _step(s, stage, p)
        ok, ok_prev = 0 <= k < m, 0 <= prev < m
        if fwd:
            ops += [("recv", "act", k, stage - 1)] if ok and stage > 0 else []
            ops += [("send", "grad", prev, stage - 1)] if ok_prev and stage > 0 else []
        else:
            ops += [("send", "act", prev, stage + 1)] if ok_prev and stage < p - 1 else []
            ops += [("recv", "grad", k, stage + 1)] if ok and stage < p - 1 else []
        ops += [("F" if fwd else "B", k)] if ok else []
        prev = k
    return ops


def simulate(forward: list[float], backward: list[float], transfer: float, m: int) -> float:
    """Seconds until every stage (one per entry of ``forward``) has run ``m`` microbatches; a
    transfer holds both ends ``transfer``."""
    p = len(forward)
    progs = [program(i, p, m) for i in range(p)]
    pc, clock, waiting, finished = [0] * p, [0.0] * p, {}, {}
    moved = True
    while moved:
        moved = False
        for i in range(p):
            while pc[i] < len(progs[i]):
                op = progs[i][pc[i]]
                if op[0] in ("F", "B"):
                    clock[i] += forward[i] if op[0] == "F" else backward[i]
                else:
                    key = (op[1], op[2]) + ((i, op[3]) if op[0] == "send" else (op[3], i))
                    if key in finished:  # this end waited; the other end has moved it
                        clock[i] = max(clock[i], finished.pop(key))
                    elif key in waiting and waiting[key][0] != i:  # both there: both leave at its end
                        clock[i] = finished[key] = max(waiting.pop(key)[1], clock[i]) + transfer
                    else:
                        waiting.setdefault(key, (i, clock[i]))
                        break
                pc[i] += 1
                moved = True
    assert all(pc[i] == len(progs[i]) for i in range(p)), "the schedule deadlocked"
    return max(clock)


def main() -> None:
    full = SEQ * HIDDEN * 2  # one microbatch's activation (one sequence), bf16
    send = full / TENSOR / IB + 2 * LAT  # the 1/8 slice and its meta tensor
    gather = (TENSOR - 1) / TENSOR * full / NVLINK + (TENSOR - 1) * 3e-6
    rebuild = gather + (full + 2 * full / TENSOR + 2 * full) / HBM  # zeros, copy in, clone out
    forward, backward = [], []
    for i in range(P):
        f = FORWARD + (rebuild if i > 0 else 0.0) + (HEAD if i == P - 1 else 0.0)
        b = BACKWARD + (2 * rebuild if i < P - 1 else 0.0) + (2 * HEAD if i == P - 1 else 0.0)
        forward.append(f)
        backward.append(b)
    engine = simulate(forward, backward, send, M)
    priced = (M + P - 1) * (FORWARD + BACKWARD + 3 * HEAD + 2 * (send - LAT + gather))
    print(f"DeepSpeed TrainSchedule, blocking sends: {engine:.2f} s per step")
    print(f"(m + p - 1) x the slowest stage with the priced scatter/gather: {priced:.2f} s "
          f"(DeepSpeed / priced = {engine / priced:.4f})")


if __name__ == "__main__":
    main()
