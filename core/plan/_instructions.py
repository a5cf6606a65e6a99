"""Pipeline schedules as per-mesh instruction lists (RUN, SEND, RECV, FREE).

The runtime executes these lists and the widgets draw them, so the order of
work on every mesh is plain data that tests can read: how many microbatches'
activations a stage holds, which stage waits on which.  `_simulate` plays
the same lists with a plan's predicted costs: that is the plan's price.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Literal, Sequence

from alpaviz.core.graph import Role

Op = Literal["run", "send", "recv", "free"]
ONCE = -1  # the microbatch index of work done once per step (the optimizer update)
# The pipeline schedules `compute_order` knows: 1F1B, GPipe, zero bubble H1 (backward split into B and W),
# and interleaved 1F1B (several model chunks, i.e. stages, per submesh).
SCHEDULE_KINDS: tuple[str, ...] = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")
INTERLEAVED = "interleaved-1f1b"
# The task a zero-bubble schedule splits off a stage's backward: what only weight gradients need (its W).
WEIGHT_GRAD = "weight_grad"


def update_role(level: int) -> str:
    """The task name of a stage's update at `level`.

    The update of one stage can need a value from another stage's update (a
    global gradient norm sums every stage's gradients): it then runs in
    levels, each stage's level l after every level l-1, values moving across
    stages only from one level to the next.
    """
    return "update" if level == 0 else f"update{level}"


def is_update(role: str) -> bool:
    return role.startswith("update")


def timeline_kind(role: str) -> str:
    """The role a timeline shows for a task: every update level is drawn as the update."""
    return "update" if is_update(role) else role


def update_level(role: str) -> int:
    return int(role[len("update"):] or 0)


def num_update_levels(edges: Iterable["Edge"]) -> int:
    """How many update levels the edges need (1 when no update reads another stage's update)."""
    levels = [update_level(r) for e in edges for r in (e.src_role, e.dst_role) if is_update(r)]
    return 1 + max(levels, default=0)


@dataclasses.dataclass(frozen=True)
class Edge:
    """Data flowing from one stage's task to another's (`src_role` -> `dst_role`).

    Edges between forward/backward tasks carry one message per microbatch;
    an edge into an update task carries one message per step.
    """

    src_stage: int
    src_role: Role
    dst_stage: int
    dst_role: Role
    nbytes: float = 0.0

    @property
    def per_microbatch(self) -> bool:
        return not is_update(self.src_role) and not is_update(self.dst_role)


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One entry of a mesh's list.

    `role` is the task run (RUN), the producing task (SEND/RECV) or the task
    whose per-microbatch buffers are dropped (FREE); `peer` is the other
    stage of a SEND (receiver) or RECV (sender); `peer_role` the consuming task.
    """

    op: Op
    stage: int
    role: Role
    microbatch: int
    peer: int = -1
    peer_role: Role | None = None

    def __str__(self) -> str:
        mb = "once" if self.microbatch == ONCE else f"mb{self.microbatch}"
        if self.op == "run":
            return f"RUN {self.role} {mb}"
        if self.op == "send":
            return f"SEND {self.role} {mb} -> stage {self.peer} ({self.peer_role})"
        if self.op == "recv":
            return f"RECV {self.role} {mb} <- stage {self.peer} ({self.peer_role})"
        return f"FREE {mb}"

    @property
    def transfer_key(self) -> tuple[int, str, int, str, int]:
        """The same key on a SEND and its matching RECV: (src, src_role, dst, dst_role, mb)."""
        if self.op == "send":
            return (self.stage, self.role, self.peer, str(self.peer_role), self.microbatch)
        if self.op == "recv":
            return (self.peer, self.role, self.stage, str(self.peer_role), self.microbatch)
        raise ValueError(f"{self} is not a transfer")


Program = tuple[tuple[Instruction, ...], ...]


def chain_edges(num_stages: int) -> tuple[Edge, ...]:
    """The edges of a plain pipeline: activations forward, gradients backward."""
    out = []
    for i in range(num_stages - 1):
        out.append(Edge(i, "forward", i + 1, "forward"))
        out.append(Edge(i + 1, "backward", i, "backward"))
    return tuple(out)


def compute_order(
    kind: str, num_stages: int, num_microbatches: int, stage: int, update_levels: int = 1,
) -> tuple[tuple[Role, int], ...]:
    """The (role, microbatch) runs of one stage, the update's levels last.

    GPipe runs every forward, then every backward.  1F1B (PipeDream-flush)
    warms up with min(n - i - 1, m) forwards on stage i, then alternates one
    forward and one backward, then drains the remaining backwards.  ZB-H1
    (zero bubble, Qi et al. 2024) runs 1F1B's order with each backward split
    into B (the input gradient the stage before waits for) and W (the
    `WEIGHT_GRAD` task): stage i runs a microbatch's W only once i later B's
    have run, so the W's fill the warm-up and drain bubbles while every
    stage holds at most n microbatches, 1F1B's peak.  Interleaved 1F1B
    orders a submesh's several stages together: see `mesh_order`.
    """
    n, m = num_stages, num_microbatches
    if not 0 <= stage < n:
        raise ValueError(f"stage {stage} is outside a pipeline of {n} stages")
    if kind == "zb-h1":
        runs = _zero_bubble_h1(n, m, stage)
    elif kind == "gpipe":
        runs = [("forward", k) for k in range(m)] + [("backward", k) for k in range(m)]
    elif kind == "1f1b":
        runs = _one_f_one_b(n, m, stage)
    elif kind == INTERLEAVED:
        raise ValueError("interleaved 1F1B orders a submesh's stages together: use mesh_order")
    else:
        raise ValueError(f"unknown schedule kind {kind!r}; use one of {list(SCHEDULE_KINDS)}")
    runs += [(update_role(level), ONCE) for level in range(update_levels)]
    return tuple(runs)  # type: ignore[return-value]


def mesh_order(
    kind: str, num_stages: int, num_microbatches: int, mesh: int, update_levels: int = 1, chunks: int = 1,
) -> tuple[tuple[int, Role, int], ...]:
    """The (stage, role, microbatch) runs of one submesh's list.

    With one chunk a submesh holds one stage (`compute_order`).  Interleaved
    1F1B (Narayanan et al. 2021) puts `chunks` = v stages on each of the
    p = n / v submeshes, stage j on submesh j mod p.  A submesh takes its
    microbatches in groups of p: the group's forwards through its first
    chunk, then through its second, and so on (backwards in the reverse
    chunk order); it warms up with 2(p - d - 1) + (v - 1)p such forwards on
    submesh d, then alternates one forward and one backward, then drains.
    A bubble then lasts a chunk's time, not a stage's: about 1/v of 1F1B's.
    The microbatch count must be a multiple of p.
    """
    check_chunks(kind, num_stages, num_microbatches, chunks)
    if kind != INTERLEAVED:
        return tuple((mesh, role, k) for role, k in compute_order(kind, num_stages, num_microbatches, mesh,
                                                                   update_levels))
    p, v, m = num_stages // chunks, chunks, num_microbatches
    if not 0 <= mesh < p:
        raise ValueError(f"submesh {mesh} is outside a pipeline of {p} submeshes")

    def nth(k: int, backward: bool) -> tuple[int, str, int]:
        chunk = (k // p) % v
        microbatch = (k // (p * v)) * p + k % p
        if backward:
            return ((v - 1 - chunk) * p + mesh, "backward", microbatch)
        return (chunk * p + mesh, "forward", microbatch)

    total = m * v
    warm = min(2 * (p - mesh - 1) + (v - 1) * p, total)
    runs = [nth(k, False) for k in range(warm)]
    for k in range(total - warm):
        runs += [nth(warm + k, False), nth(k, True)]
    runs += [nth(k, True) for k in range(total - warm, total)]
    runs += [(c * p + mesh, update_role(level), ONCE) for level in range(update_levels) for c in range(v)]
    return tuple(runs)  # type: ignore[return-value]


def check_chunks(kind: str, num_stages: int, num_microbatches: int, chunks: int) -> None:
    """Refuse a chunk count the schedule cannot run, saying what would."""
    if chunks == 1 and kind != INTERLEAVED:
        return
    if kind != INTERLEAVED:
        raise ValueError(f"{chunks} chunks per submesh needs schedule {INTERLEAVED!r}; {kind!r} runs one")
    if chunks < 2 or num_stages % chunks or num_stages // chunks < 2:
        raise ValueError(
            f"interleaved 1F1B needs at least 2 chunks per submesh and at least 2 submeshes, the stage count a "
            f"multiple of the chunks; got {num_stages} stages in {chunks} chunks (with one submesh, or one "
            f"chunk, use '1f1b')"
        )
    meshes = num_stages // chunks
    if num_microbatches % meshes:
        raise ValueError(
            f"interleaved 1F1B takes microbatches in groups of the submesh count ({meshes}); "
            f"{num_microbatches} microbatches is not a multiple: use {meshes * max(1, round(num_microbatches / meshes))}"
        )


def _one_f_one_b(n: int, m: int, stage: int) -> list[tuple[str, int]]:
    """1F1B's forward and backward runs of one stage (see `compute_order`)."""
    warm = min(n - stage - 1, m)
    runs = [("forward", k) for k in range(warm)]
    for k in range(m - warm):
        runs += [("forward", warm + k), ("backward", k)]
    return runs + [("backward", k) for k in range(m - warm, m)]


def _zero_bubble_h1(n: int, m: int, stage: int) -> list[tuple[str, int]]:
    """ZB-H1's forward, B and W runs of one stage: 1F1B's order, W delayed by `stage` backwards."""
    runs: list[tuple[str, int]] = []
    waiting: list[int] = []  # microbatches whose B has run and whose W has not
    for role, k in _one_f_one_b(n, m, stage):
        runs.append((role, k))
        if role == "backward":
            waiting.append(k)
            if len(waiting) > stage:
                runs.append((WEIGHT_GRAD, waiting.pop(0)))
    return runs + [(WEIGHT_GRAD, k) for k in waiting]


def build_instructions(
    kind: str,
    num_stages: int,
    num_microbatches: int,
    edges: Iterable[Edge] | None = None,
    chunks: int = 1,
) -> Program:
    """Per-mesh instruction lists for a schedule and the stages' data flow.

    One list per submesh: stage i's under one chunk, stages d, d + p, ...
    of submesh d under interleaved 1F1B (see `mesh_order`).

    Around each RUN: a RECV for every edge into that task (before), a SEND
    for every edge out of it (after).  Edges into update tasks are sent once,
    after the last microbatch of the producing task.  A FREE follows each
    backward (each W under ZB-H1): that microbatch's stashed activations are
    no longer needed.

    Example:
        >>> lists = build_instructions("1f1b", num_stages=4, num_microbatches=8)
        >>> print(*lists[0][:4], sep="\\n")
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    check_chunks(kind, num_stages, num_microbatches, chunks)
    edges = tuple(chain_edges(num_stages) if edges is None else edges)
    for e in edges:
        if not (0 <= e.src_stage < num_stages and 0 <= e.dst_stage < num_stages) or e.src_stage == e.dst_stage:
            raise ValueError(f"edge {e} does not join two different stages of {num_stages}")
    program = []
    levels = num_update_levels(edges)
    freed_after = WEIGHT_GRAD if kind == "zb-h1" else "backward"  # the last task to read a microbatch's buffers
    for mesh in range(num_stages // chunks):
        runs = mesh_order(kind, num_stages, num_microbatches, mesh, levels, chunks)
        last_of = {(stage, role): k for stage, role, k in runs}  # the final microbatch each task runs
        out: list[Instruction] = []
        for stage, role, k in runs:
            for e in edges:
                if e.dst_stage == stage and e.dst_role == role:
                    out.append(Instruction("recv", stage, e.src_role, k, e.src_stage, role))
            out.append(Instruction("run", stage, role, k))
            for e in edges:
                if e.src_stage != stage or e.src_role != role:
                    continue
                if e.per_microbatch:
                    out.append(Instruction("send", stage, role, k, e.dst_stage, e.dst_role))
                elif is_update(role) or k == last_of[(stage, role)]:
                    out.append(Instruction("send", stage, role, ONCE, e.dst_stage, e.dst_role))
            if role == freed_after:
                out.append(Instruction("free", stage, "forward", k))
        program.append(tuple(out))
    return tuple(program)


def fusable_runs(program: Program) -> dict[tuple[int, str, int], tuple[str, ...]]:
    """RUNs a driver may execute as one executable: (stage, role, mb) of the first -> the roles fused.

    A forward immediately followed on its mesh by the backward of the same
    microbatch (nothing sent or received between: the last stage under
    1F1B, or a lone stage) fuses into one forward+backward, with the W of
    that microbatch when it comes next (a lone stage under ZB-H1); when that
    is the whole list apart from a FREE and the update (one stage, one
    microbatch), the update joins too, giving one executable per step.
    """
    out: dict[tuple[int, str, int], tuple[str, ...]] = {}
    for lst in program:
        for i, ins in enumerate(lst[:-1]):
            nxt = lst[i + 1]
            if not (ins.op == "run" and ins.role == "forward" and nxt.op == "run" and nxt.role == "backward"
                    and nxt.microbatch == ins.microbatch and nxt.stage == ins.stage):
                continue
            roles, j = ["forward", "backward"], i + 2
            after = lst[j] if j < len(lst) else None
            if after and after.op == "run" and after.role == WEIGHT_GRAD and after.microbatch == ins.microbatch:
                roles.append(WEIGHT_GRAD)
                j += 1
            rest = [x for x in lst[j:] if x.op != "free"]
            whole = i == 0 and len(rest) == 1 and rest[0].op == "run" and rest[0].role == "update"
            out[(ins.stage, "forward", ins.microbatch)] = (*roles, "update") if whole else tuple(roles)
    return out


def max_live_microbatches(instructions: Sequence[Instruction], stage: int | None = None) -> int:
    """The most microbatches whose forward activations one list holds at once (a microbatch of each of
    its stages counted apart: with interleaved 1F1B a list holds several stages), or only `stage`'s."""
    live: set[tuple[int, int]] = set()
    peak = 0
    for ins in instructions:
        if stage is not None and ins.stage != stage:
            continue
        if ins.op == "run" and ins.role == "forward":
            live.add((ins.stage, ins.microbatch))
            peak = max(peak, len(live))
        elif ins.op == "free":
            live.discard((ins.stage, ins.microbatch))
    return peak


def interleave(program: Program) -> tuple[Instruction, ...]:
    """One global order of all lists in which every RECV comes after its SEND.

    A single driver can dispatch in this order without deadlock; it takes
    the next instruction of each mesh in turn, skipping a mesh while it
    waits on a RECV.
    """
    cursor = [0] * len(program)
    sent: set[tuple] = set()
    order: list[Instruction] = []
    total = sum(len(lst) for lst in program)
    while len(order) < total:
        progressed = False
        for stage, lst in enumerate(program):
            while cursor[stage] < len(lst):
                ins = lst[cursor[stage]]
                if ins.op == "recv" and ins.transfer_key not in sent:
                    break
                if ins.op == "send":
                    sent.add(ins.transfer_key)
                order.append(ins)
                cursor[stage] += 1
                progressed = True
                if ins.op == "run":
                    break  # one unit of work per mesh per turn keeps the meshes in step
        if not progressed:
            stuck = {s: str(program[s][c]) for s, c in enumerate(cursor) if c < len(program[s])}
            raise ValueError(f"the instruction lists deadlock; each mesh waits at {stuck}")
    return tuple(order)
