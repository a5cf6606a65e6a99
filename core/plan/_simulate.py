"""A plan's step as a timeline, played from its predicted stage costs (the predicted Gantt chart)."""

from __future__ import annotations

from typing import Literal, Mapping

from alpaviz.core.plan._dataflow import analyze
from alpaviz.core.plan._instructions import Edge, Program, build_instructions, chain_edges, interleave, is_update, timeline_kind
from alpaviz.core.plan._timeline import Timeline, TimelineEvent


def simulate(
    program: Program,
    run_s: Mapping[tuple[int, str], float],
    transfer_s: Mapping[tuple[int, str, int, str], float],
    schedule: str,
    num_microbatches: int,
    source: Literal["predicted", "measured"] = "predicted",
    hardware: str = "",
) -> Timeline:
    """Play the lists with fixed durations: RUN takes `run_s[(stage, role)]`; a SEND occupies
    the sender for `transfer_s[(src, src_role, dst, dst_role)]` and its RECV waits for arrival."""
    clock = [0.0] * len(program)
    arrival: dict[tuple, tuple[float, float]] = {}
    events: list[TimelineEvent] = []
    for ins in interleave(program):
        s = ins.stage
        mb = ins.microbatch
        if ins.op == "run":
            start = clock[s]
            clock[s] = start + run_s.get((s, ins.role), 0.0)
            if clock[s] > start or not is_update(ins.role):
                events.append(TimelineEvent(s, mb, timeline_kind(ins.role), start, clock[s]))
        elif ins.op == "send":
            start = clock[s]
            duration = transfer_s.get(ins.transfer_key[:4], 0.0)
            clock[s] = start + duration
            arrival[ins.transfer_key] = (start, clock[s])
            if duration > 0:
                events.append(TimelineEvent(s, mb, "send", start, clock[s]))
        elif ins.op == "recv":
            sent_at, arrived = arrival[ins.transfer_key]
            start = max(clock[s], sent_at)
            end = max(clock[s], arrived)
            if end > clock[s]:
                events.append(TimelineEvent(s, mb, "recv", start, end))
            clock[s] = end
    return Timeline(
        events=tuple(events),
        num_stages=len(program),
        num_microbatches=num_microbatches,
        schedule=schedule,
        source=source,
        hardware=hardware,
    )


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
    n, m = plan.num_stages, plan.schedule.num_microbatches
    receive, run_s = {}, {}
    for stage in plan.stages:
        c = stage.cost
        for role, total, received in (("forward", c.forward_s, c.recv_forward_s),
                                      ("backward", c.backward_s, c.recv_backward_s),
                                      ("update", c.update_s, c.recv_update_s)):
            receive[(stage.index, role)] = received
            run_s[(stage.index, role)] = total - received
    edges: tuple[Edge, ...] = chain_edges(n) if graph is None else analyze(graph, plan).edges
    incoming: dict[tuple[int, str], list[Edge]] = {}
    for e in edges:
        incoming.setdefault((e.dst_stage, timeline_kind(e.dst_role)), []).append(e)
    transfer_s: dict[tuple[int, str, int, str], float] = {}
    for key, into in incoming.items():
        total = sum(e.nbytes for e in into)
        for e in into:
            share = e.nbytes / total if total > 0 else 1.0 / len(into)
            transfer_s[(e.src_stage, e.src_role, e.dst_stage, e.dst_role)] = receive.get(key, 0.0) * share
    program = build_instructions(plan.schedule.kind, n, m, edges)
    return simulate(program, run_s, transfer_s, plan.schedule.kind, m, hardware=plan.cluster.name)
