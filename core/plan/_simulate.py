"""A plan's step as a timeline, played from its predicted stage costs (the predicted Gantt chart)."""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping

from alpaviz.core.plan._dataflow import analyze
from alpaviz.core.plan._instructions import (
    WEIGHT_GRAD, Edge, Instruction, Program, build_instructions, chain_edges, fusable_runs, is_update, timeline_kind,
)
from alpaviz.core.plan._shared_hardware import SharedHardware
from alpaviz.core.plan._timeline import Timeline, TimelineEvent


# run_s's role for a backward fused with its own forward (see `plan_program`)
FUSED_BACKWARD = "backward fused with its forward"


@dataclasses.dataclass
class _Task:
    """A RUN or SEND in progress: a fixed part (the launch) first, then work shared with others."""

    ins: Instruction
    start_s: float
    fixed_s: float
    work_s: float
    links: tuple = ()

    @property
    def computing(self) -> bool:
        return self.ins.op == "run" and self.fixed_s <= 0.0


def simulate(
    program: Program,
    run_s: Mapping[tuple[int, str], float],
    transfer_s: Mapping[tuple[int, str, int, str], float],
    schedule: str,
    num_microbatches: int,
    source: Literal["predicted", "measured"] = "predicted",
    hardware: str = "",
    shared: SharedHardware | None = None,
) -> Timeline:
    """Play the lists (one per submesh) as events on shared resources; the events' rows are the lists.

    A RUN takes the launch cost, then `run_s[(stage, role)]` of work at the
    rate its devices get while the other stages' devices are busy too (see
    `SharedHardware`); a SEND occupies the sender for
    `transfer_s[(src, src_role, dst, dst_role)]`, stretched while other
    transfers share its link, and its RECV waits for arrival.  A backward the
    runtime fuses with its own forward (`fusable_runs`) launches nothing and
    takes `run_s[(stage, FUSED_BACKWARD)]` where given (a recomputing
    stage's backward without the recompute).  Without `shared` nothing is
    shared and nothing is launched: fixed durations.
    """
    player = _Player(program, run_s, transfer_s, shared)
    player.advance()
    while player.active:
        player.step()
        player.advance()
    stuck = {s: str(program[s][c]) for s, c in enumerate(player.cursor) if c < len(program[s])}
    if stuck:
        raise ValueError(f"the instruction lists deadlock; each mesh waits at {stuck}")
    return Timeline(
        events=tuple(sorted(player.events, key=lambda e: (e.start_s, e.stage))),
        num_stages=len(program),
        num_microbatches=num_microbatches,
        schedule=schedule,
        source=source,
        hardware=hardware,
        chunks=max(len(player.list_of) // max(len(program), 1), 1),
    )


class _Player:
    """The simulation's state: where each stage's list stands, the tasks in progress, what has arrived."""

    def __init__(self, program: Program, run_s, transfer_s, shared: SharedHardware | None) -> None:
        self.program, self.run_s, self.transfer_s, self.shared = program, run_s, transfer_s, shared
        self.launch_s = 0.0 if shared is None else shared.launch_s
        self.fused = fusable_runs(program)
        self.cursor = [0] * len(program)
        self.list_of = {ins.stage: s for s, lst in enumerate(program) for ins in lst}  # stage -> its list
        self.active: dict[int, _Task] = {}
        self.sent_at: dict[tuple, float] = {}
        self.arrived: dict[tuple, float] = {}
        self.reached: dict[int, float] = {}  # when a stage began waiting at a RECV
        self.events: list[TimelineEvent] = []
        self.now = 0.0

    def advance(self) -> None:
        """Every idle stage goes as far as it can now; a SEND may free another's RECV, so repeat."""
        moved = True
        while moved:
            moved = False
            for s in range(len(self.program)):
                while s not in self.active and self.cursor[s] < len(self.program[s]):
                    if not self._begin(s, self.program[s][self.cursor[s]]):
                        break
                    self.cursor[s] += 1
                    moved = True

    def _begin(self, s: int, ins: Instruction) -> bool:
        """Start `ins` on stage `s`; False when it is a RECV whose data has not arrived."""
        if ins.op == "recv":
            key = ins.transfer_key
            if key not in self.arrived:
                self.reached.setdefault(s, self.now)
                return False
            waited_from = max(self.reached.pop(s, self.now), self.sent_at[key])
            if self.now > waited_from:
                self.events.append(TimelineEvent(s, ins.microbatch, "recv", waited_from, self.now,
                                                 ins.stage // len(self.program)))
            return True
        if ins.op == "free":
            return True
        if ins.op == "run":
            # A backward fused with its forward runs in the forward's executable: no launch of its own,
            # and none of the forward nodes a recomputing stage would run again (the group runs each once).
            fused_roles = self.fused.get((ins.stage, "forward", ins.microbatch), ())
            fused = ins.role in ("backward", WEIGHT_GRAD) and ins.role in fused_roles
            work = self.run_s.get((ins.stage, ins.role), 0.0)
            if fused:
                work = self.run_s.get((ins.stage, FUSED_BACKWARD), work)
            task = _Task(ins, self.now, self.launch_s if work > 0 and not fused else 0.0, work)
        else:
            self.sent_at[ins.transfer_key] = self.now
            links = () if self.shared is None else self.shared.links(s, self.list_of[ins.peer])
            task = _Task(ins, self.now, 0.0, self.transfer_s.get(ins.transfer_key[:4], 0.0), links)
        if task.fixed_s + task.work_s > 0:
            self.active[s] = task
        else:
            self._finish(s, task)
        return True

    def step(self) -> None:
        """Move time to the next task's end at the current rates, and finish it."""
        rates = _rates(self.active, self.shared)
        step = min(t.fixed_s if t.fixed_s > 0 else t.work_s / rates[s] for s, t in self.active.items())
        self.now += step
        for s, task in list(self.active.items()):
            if task.fixed_s > 0:
                task.fixed_s = 0.0 if task.fixed_s <= step * (1 + 1e-12) else task.fixed_s - step
            else:
                left = task.work_s - step * rates[s]
                task.work_s = 0.0 if left <= task.work_s * 1e-12 + 1e-18 else left
            if task.fixed_s <= 0 and task.work_s <= 0:
                del self.active[s]
                self._finish(s, task)

    def _finish(self, s: int, task: _Task) -> None:
        ins, now = task.ins, self.now
        chunk = ins.stage // len(self.program)
        if ins.op == "send":
            self.arrived[ins.transfer_key] = now
            if now > task.start_s:
                self.events.append(TimelineEvent(s, ins.microbatch, "send", task.start_s, now, chunk))
        elif now > task.start_s or not is_update(ins.role):
            self.events.append(TimelineEvent(s, ins.microbatch, timeline_kind(ins.role), task.start_s, now, chunk))


def _rates(active: Mapping[int, _Task], shared: SharedHardware | None) -> dict[int, float]:
    """Each task's rate of work now: computing stages share their hosts' cores, transfers their links."""
    if shared is None:
        return {s: 1.0 for s in active}
    busy: dict[int, int] = {}
    on_link: dict = {}
    shares_cores = shared.shares_cores
    for s, task in active.items():
        if shares_cores and task.computing:
            for host, count in shared.stage_hosts[s]:
                busy[host] = busy.get(host, 0) + count
        for link in task.links:
            on_link[link] = on_link.get(link, 0) + 1
    rates = {}
    for s, task in active.items():
        if task.ins.op == "run":
            rates[s] = shared.speedup(s, busy) if shares_cores else 1.0
        elif task.links:
            rates[s] = 1.0 / max(on_link[link] for link in task.links)
        else:
            rates[s] = 1.0
    return rates


def predicted_timeline(plan, graph=None) -> Timeline:
    """The plan's step simulated from its predicted stage costs (for the predicted Gantt chart).

    RUN durations are `stage.cost.forward_s / backward_s / update_s` less
    the time the plan charges each stage for receiving (`recv_*_s`); that
    time is played as the sender's SEND instead, so every second the plan
    prices appears once.  With `graph` (the traced step the plan was made
    for) the transfers follow the tensors that really cross stages, each
    stage's receive time split over its incoming edges by their bytes;
    without it, the chain of adjacent stages is assumed.  Update events carry
    microbatch -1 (`ONCE`).

    Example:
        >>> timeline = av.predicted_timeline(plan)
        >>> timeline.bubble_fraction
    """
    program, run_s, transfer_s = plan_program(plan, graph)
    return simulate(program, run_s, transfer_s, plan.schedule.kind, plan.schedule.num_microbatches,
                    hardware=plan.cluster.name, shared=SharedHardware.of_plan(plan))


def plan_program(plan, graph=None) -> tuple[Program, dict, dict]:
    """The plan's instruction lists with each RUN's and each SEND's priced seconds (see `predicted_timeline`)."""
    n, m = plan.num_stages, plan.schedule.num_microbatches
    receive, run_s = {}, {}
    for stage in plan.stages:
        c = stage.cost
        for role, total, received in (("forward", c.forward_s, c.recv_forward_s),
                                      ("backward", c.backward_s, c.recv_backward_s),
                                      ("update", c.update_s, c.recv_update_s)):
            receive[(stage.index, role)] = received
            run_s[(stage.index, role)] = total - received
        if stage.remat:  # fused with its forward, the backward does not run the forward again
            recompute = c.forward_s - c.recv_forward_s
            run_s[(stage.index, FUSED_BACKWARD)] = max(c.backward_s - c.recv_backward_s - recompute, 0.0)
        if plan.schedule.kind == "zb-h1":  # the backward's W runs apart from its B
            weight_grad = min(c.weight_grad_s, run_s[(stage.index, "backward")])
            run_s[(stage.index, WEIGHT_GRAD)] = weight_grad
            run_s[(stage.index, "backward")] -= weight_grad
    edges: tuple[Edge, ...] = chain_edges(n) if graph is None else analyze(graph, plan).edges
    incoming: dict[tuple[int, str], list[Edge]] = {}
    for e in edges:  # what a W receives is part of the backward's priced receive
        into = "backward" if e.dst_role == WEIGHT_GRAD else timeline_kind(e.dst_role)
        incoming.setdefault((e.dst_stage, into), []).append(e)
    transfer_s: dict[tuple[int, str, int, str], float] = {}
    for key, into in incoming.items():
        total = sum(e.nbytes for e in into)
        for e in into:
            share = e.nbytes / total if total > 0 else 1.0 / len(into)
            transfer_s[(e.src_stage, e.src_role, e.dst_stage, e.dst_role)] = receive.get(key, 0.0) * share
    return build_instructions(plan.schedule.kind, n, m, edges, plan.schedule.chunks), run_s, transfer_s
