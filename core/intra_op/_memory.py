"""Per-device memory of a set of operators under a sharding, split by what each byte is for.

A training step's peak on a device is the state that lives the whole step
(parameters, optimizer state, gradients), the activations each microbatch
in flight keeps for its backward pass, and the working set of the largest
operator on top.  Everything is linear in the ILP's choice except that
max, which the ILP bounds with one constraint per operator (`MemoryRows`).
Tensors are classified by who makes and who reads them, so a
value that merely passes through (a layer's input read only by its
forward, a cotangent read only by the backward) is never counted as state.
Updated parameters and optimizer state are assumed donated (written over
their old buffers), as training loops do.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from alpaviz.core.cost import LogicalMesh
from alpaviz.core.graph import RECOMPUTABLE, OpGraph, stored_residuals
from alpaviz.core.intra_op._dim_labels import IDENTITY
from alpaviz.core.intra_op._sharding_ilp import WorkingSet, working_set_bytes
from alpaviz.core.intra_op._simplify import Simplified
from alpaviz.core.intra_op._strategies import shard_bytes
from alpaviz.core.plan import MemoryBreakdown


@dataclasses.dataclass(frozen=True)
class KeptTensors:
    """The tensors that outlive the operator that reads them, each once, by category."""

    params: tuple[str, ...]
    optimizer_state: tuple[str, ...]
    gradients: tuple[str, ...]
    activations: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return self.params + self.optimizer_state + self.gradients + self.activations


def kept_tensors(graph: OpGraph, simp: Simplified, state_inputs: frozenset[str]) -> KeptTensors:
    """Classify what the operators of `simp` keep alive (only tensors with an ILP decision).

    `state_inputs` are the step inputs the step replaces (parameters and
    optimizer state).  A state input the forward or backward reads is a
    parameter; one only the update reads is optimizer state.  Gradients are
    backward values an update reads; activations are forward values (or
    batch inputs) a backward reads.  Whatever else is read is transient.
    """
    readers: dict[str, set[str]] = {}
    for name in simp.nodes:
        node = graph.node(name)
        for raw in node.inputs:
            t = simp.resolve(raw)
            if t in simp.group_of_tensor and not simp.is_free(graph, t):
                readers.setdefault(t, set()).add(node.role)
    params, opt, grads, acts = [], [], [], []
    for t, roles in readers.items():
        info = graph.tensor(t)
        made_by = graph.node(info.producer).role if info.producer else None
        if info.producer is None and t in state_inputs:
            (params if roles - {"update"} else opt).append(t)
        elif made_by == "backward" and "update" in roles:
            grads.append(t)
        elif made_by in ("forward", None) and "backward" in roles:
            acts.append(t)
    # The backward reruns one-operand elementwise chains (XLA inside a program, the runtime across a stage's
    # forward and backward executables), so only their inputs are stored.  Checked against
    # `compiled.memory_analysis()` (benchmarks/memory.py): counting every intermediate over-predicted GPT's
    # stages by up to 1.44x, recomputing binary operators as well under-predicted them by up to 0.67x.
    stored = stored_residuals(graph, acts)
    return KeptTensors(tuple(params), tuple(opt), tuple(grads), tuple(t for t in acts if t in stored))


@dataclasses.dataclass(frozen=True)
class MemoryRows:
    """Per-device bytes as functions of the ILP's choice: linear rows per category, and working sets.

    `rows[category][g][k]` is what group g adds to `category` when it picks
    option k.  Each working set is one operator's transient operands and
    results as (group, option, bytes) terms plus a constant; the peak is
    the rows' sum plus the largest working set, which the ILP bounds with
    one constraint per working set.
    """

    rows: Mapping[str, tuple[tuple[float, ...], ...]]
    working_sets: tuple[WorkingSet, ...]

    @property
    def linear(self) -> tuple[tuple[float, ...], ...]:
        """Rows summed over the categories (state and one microbatch's activations)."""
        columns = list(self.rows.values())
        return tuple(tuple(sum(c[g][k] for c in columns) for k in range(len(columns[0][g])))
                     for g in range(len(columns[0])))

    def breakdown(self, choice: Sequence[int]) -> MemoryBreakdown:
        total = {c: float(sum(rows[g][k] for g, k in enumerate(choice))) for c, rows in self.rows.items()}
        largest = max((working_set_bytes(ws, choice) for ws in self.working_sets), default=0.0)
        return MemoryBreakdown(total["params"], total["optimizer_state"], total["gradients"],
                               total["activations"], largest)


def memory_rows(graph: OpGraph, simp: Simplified, kept: KeptTensors, mesh: LogicalMesh) -> MemoryRows:
    """The memory model of `simp`'s operators as linear rows over its groups' options.

    A tensor made by a reduce-scatter counts at its unreduced size where
    that matters: a gradient, because XLA combines the gradients'
    reduce-scatters into few collectives late in the step, so the full-size
    partial sums are live together; and inside its operator's working set.
    Elementwise operators and views have no working set of their own: XLA
    fuses them into their neighbours (the optimizer's update becomes one
    in-place loop over donated buffers).
    """
    num_options = [g.num_options for g in simp.groups]
    known: dict[tuple[str, bool], tuple[int, list[float]]] = {}

    def sizes(t: str, unreduced: bool) -> tuple[int, list[float]]:
        """The group deciding `t` and its per-device bytes under each option (read-only: shared)."""
        found = known.get((t, unreduced))
        if found is None:
            found = known[t, unreduced] = measure(t, unreduced)
        return found

    def measure(t: str, unreduced: bool) -> tuple[int, list[float]]:
        g = simp.group_of_tensor[t]
        info = graph.tensor(t)
        out = [shard_bytes(info, spec, mesh) for spec in simp.tensor_specs[t]]
        producer = info.producer
        if unreduced and producer in simp.group_of_node and simp.group_of_node[producer] == g:
            for k in range(num_options[g]):
                strategy = simp.strategies[producer][simp.choice[producer][k]]
                for c in strategy.collectives:
                    if c.kind == "reduce-scatter":
                        out[k] = max(out[k], c.nbytes)
        return g, out

    rows = {}
    for category, names in (("params", kept.params), ("optimizer_state", kept.optimizer_state),
                            ("gradients", kept.gradients), ("activations", kept.activations)):
        table = [[0.0] * n for n in num_options]
        for t in names:
            g, values = sizes(t, unreduced=category == "gradients")
            for k, v in enumerate(values):
                table[g][k] += v
        rows[category] = tuple(map(tuple, table))
    counted = set(kept.all)
    working: dict = {}
    for name in simp.nodes:
        node = graph.node(name)
        if node.primitive in IDENTITY or node.primitive in RECOMPUTABLE:  # fused into their neighbours
            continue
        constant, terms = 0.0, []
        for t in dict.fromkeys(simp.resolve(raw) for raw in node.inputs + node.outputs):
            if t in counted:
                continue
            if t not in simp.group_of_tensor:
                constant += shard_bytes(graph.tensor(t), None, mesh)
                continue
            g, values = sizes(t, unreduced=True)
            terms += [(g, k, v) for k, v in enumerate(values) if v]
        working[(constant, tuple(sorted(terms)))] = None
    return MemoryRows(rows, tuple(working))
