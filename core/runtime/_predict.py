"""A plan's step as a timeline, played from its predicted stage costs (the predicted Gantt chart)."""

from __future__ import annotations

from typing import Literal, Mapping

from alpaviz.core.runtime._dataflow import analyze
from alpaviz.core.runtime._schedule import Edge, Program, build_instructions, chain_edges, interleave, is_update, timeline_kind
from alpaviz.core.runtime._timeline import Timeline, TimelineEvent


def simulate(
    program: Program,
    run_s: Mapping[tuple[int, str], float],
    transfer_s: Mapping[tuple[int, str, int, str], float],
    schedule: str,
    num_microbatches: int,
    source: Literal["predicted", "measured"] = "predicted",
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
    )


def predicted_timeline(plan, graph=None) -> Timeline:
    """The plan's step simulated from its predicted stage costs (for the predicted Gantt chart).

    RUN durations are `stage.cost.forward_s / backward_s / update_s` (per
    microbatch).  With `graph` (the traced step the plan was made for),
    transfers between stages take `plan.cost_model.send_recv` of the bytes
    that really cross each boundary per microbatch, over the inter-host link
    when the two stages' devices sit on different hosts; without it, the
    transfers are taken as free and the chain of adjacent stages is assumed.
    Update events carry microbatch -1 (`ONCE`).

    Example:
        >>> timeline = av.predicted_timeline(plan)
        >>> timeline.bubble_fraction
    """
    n, m = plan.num_stages, plan.schedule.num_microbatches
    run_s = {}
    for stage in plan.stages:
        run_s[(stage.index, "forward")] = stage.cost.forward_s
        run_s[(stage.index, "backward")] = stage.cost.backward_s
        run_s[(stage.index, "update")] = stage.cost.update_s
    transfer_s: dict[tuple[int, str, int, str], float] = {}
    if graph is None:
        edges: tuple[Edge, ...] = chain_edges(n)
    else:
        edges = analyze(graph, plan).edges
        per_host = plan.cluster.devices_per_host
        for e in edges:
            hosts = {d // per_host for d in plan.stages[e.src_stage].device_ids + plan.stages[e.dst_stage].device_ids}
            link = plan.cluster.inter_host if len(hosts) > 1 else plan.cluster.intra_host
            transfer_s[(e.src_stage, e.src_role, e.dst_stage, e.dst_role)] = plan.cost_model.send_recv(e.nbytes, link)
    program = build_instructions(plan.schedule.kind, n, m, edges)
    return simulate(program, run_s, transfer_s, plan.schedule.kind, m)
