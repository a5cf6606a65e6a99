"""The intra-operator pass: choose every operator's sharding on one logical mesh.

`solve_sharding` enumerates strategies (`_strategies`), merges follower
operators into their anchors (`_simplify`), prices resharding between them
(`_resharding`) and solves the one-hot ILP (`_sharding_ilp`) for the least
compute + communication + resharding time, under the user's pins and an
optional per-device memory limit.  Pinning every operator turns it into an
exact cost evaluator for that assignment.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from alpaviz.core.cost import Cluster, CostModel, CostModelProtocol, LogicalMesh
from alpaviz.core.graph import (
    OpGraph, check_int, check_number, gradient_producers, state_inputs, trace, weight_gradient_nodes,
)
from alpaviz.core.intra_op._dim_labels import IDENTITY
from alpaviz.core.intra_op._memory import MemoryRows, kept_tensors, memory_rows
from alpaviz.core.intra_op._resharding import ReshardingPrices, plan_resharding
from alpaviz.core.intra_op._sharding_ilp import (
    Equal, IlpProblem, PairCost, _feasible_fixed, evaluate, peak_memory, solve,
)
from alpaviz.core.intra_op._simplify import Simplified, simplify
from alpaviz.core.intra_op._strategies import (
    NAMING_DEVICE, Strategy, enumerate_strategies, strategy_names,
)
from alpaviz.core.plan import (
    InfeasiblePinsError, Pins, ShardingCost, ShardingPlan, Spec, check_pin_names, check_spec, minimal_conflict,
    replicated, spec_name,
)

__all__ = ["ShardingInfeasibleError", "collective_counts", "parameter_aliases", "solve_sharding",
           "solve_sharding_auto", "strategy_names"]


class ShardingInfeasibleError(ValueError):
    """No sharding satisfies the pins (or the memory limit); the message names which.

    `min_memory_bytes` is set when the memory limit is the cause: the least
    per-device memory any sharding (under the pins) needs.
    """

    min_memory_bytes: float | None = None

    @classmethod
    def memory(cls, need: float, message: str) -> "ShardingInfeasibleError":
        """The error for a memory limit no strategy choice meets, carrying the least memory that would fit."""
        err = cls(message)
        err.min_memory_bytes = need
        return err


def solve_sharding(
    graph: OpGraph,
    mesh: LogicalMesh,
    cluster: Cluster,
    cost_model: CostModelProtocol = CostModel(),
    pins: Pins = Pins(),
    *,
    nodes: Sequence[str] | None = None,
    memory_limit_bytes: float | None = None,
    time_limit_s: float = 60.0,
    merge_followers: bool = True,
    num_microbatches: int = 1,
) -> ShardingPlan:
    """The cheapest sharding of `graph` (or the sub-graph `nodes`) on `mesh`.

    Tensors that `nodes` read but do not produce are inputs of the
    sub-problem.  `merge_followers=False` gives every operator its own ILP
    variable (exact over all assignments, slower).

    The objective is one training step of `num_microbatches` microbatches:
    `B x (forward + backward) + once-per-step terms`, where the once-per-step
    terms are the update and the cross-device reduction of the gradients
    (accumulated locally over the microbatches, reduced once).

    Example:
        >>> mesh = cluster.logical_mesh((1, 4), (2, 2))
        >>> plan = solve_sharding(graph, mesh, cluster)
        >>> plan.strategy_map["n12_dot_general"]
        'S0R = S0R x RR'
    """
    start = time.perf_counter()
    if memory_limit_bytes is not None:
        check_number("memory_limit_bytes", memory_limit_bytes, positive=True)
    check_number("time_limit_s", time_limit_s, positive=True)
    check_int("num_microbatches", num_microbatches, minimum=1)
    node_names = _subset(graph, nodes)
    _check_pins(graph, pins, mesh, set(node_names))
    pinned = frozenset(n for n in pins.strategy_map if n in set(node_names))
    simp = simplify(graph, node_names, mesh, cost_model, cluster.device, pinned, merge_followers)
    weights = StepWeights(graph, node_names, num_microbatches)
    problem, restrictions, memory = _assemble(graph, simp, mesh, cost_model, pins, memory_limit_bytes, weights)
    result = solve(problem, time_limit_s)
    if result.status == "no_solution":
        result = _fallback(problem, result)
    if result.status == "no_solution":
        raise ValueError(
            f"the sharding ILP found no assignment within time_limit_s={time_limit_s} "
            f"({len(simp.groups)} decision groups, {result.num_variables} variables); raise time_limit_s"
        )
    if result.choice is None:
        raise _diagnose(problem, restrictions, memory_limit_bytes, time_limit_s, mesh)
    return _plan(graph, simp, mesh, cost_model, problem, memory, result, time.perf_counter() - start, weights)


def solve_sharding_auto(
    graph_or_fn: OpGraph | Callable[..., Any],
    *args: Any,
    mesh_shape: tuple[int, int] = (1, 1),
    cluster: Cluster | None = None,
    cost_model: CostModelProtocol | None = None,
    pins: Pins | None = None,
    memory_limit: float | None = None,
    time_limit_s: float = 60.0,
    num_microbatches: int = 1,
) -> ShardingPlan:
    """Trace if needed, build the `(r, c)` logical mesh on the cluster, and solve (`av.solve_sharding`).

    Example:
        >>> plan = av.solve_sharding(train_step, params, batch, mesh_shape=(2, 2))
    """
    graph = graph_or_fn if isinstance(graph_or_fn, OpGraph) else _trace(graph_or_fn, args)
    cluster = cluster if cluster is not None else Cluster.local()
    r, c = (int(v) for v in mesh_shape)
    if r < 1 or c < 1:
        raise ValueError(f"mesh_shape must be two positive ints, got {mesh_shape!r}")
    try:
        mesh = cluster.logical_mesh((1, r * c), (r, c))
    except ValueError as err:
        raise ValueError(
            f"mesh_shape {(r, c)} needs {r * c} devices of one host, but cluster {cluster.name!r} has "
            f"{cluster.devices_per_host} per host ({err}); choose r*c <= {cluster.devices_per_host} "
            f"dividing it, e.g. (1, {cluster.devices_per_host})"
        ) from None
    return solve_sharding(graph, mesh, cluster, cost_model or CostModel(), pins or Pins(),
                          memory_limit_bytes=memory_limit, time_limit_s=time_limit_s,
                          num_microbatches=num_microbatches)


def _trace(fn: Callable[..., Any], args: tuple[Any, ...]) -> OpGraph:
    if not args:
        raise ValueError("pass example arguments after the function: solve_sharding(step, params, batch, ...)")
    return trace(fn, *args)


def parameter_aliases(graph: OpGraph) -> tuple[tuple[str, str], ...]:
    """(state input, updated state output) pairs: the step's first argument and first result share a tree."""
    try:
        in_first, out_first = graph.in_tree.children()[0], graph.out_tree.children()[0]
    except (AttributeError, IndexError, TypeError):
        return ()
    if in_first != out_first:
        return ()
    n = in_first.num_leaves
    return tuple((i, o) for i, o in zip(graph.inputs[:n], graph.outputs[:n]) if i != o)


# ---- validation ---------------------------------------------------------------------------


def _subset(graph: OpGraph, nodes: Sequence[str] | None) -> list[str]:
    if nodes is None:
        return [n.name for n in graph.nodes]
    wanted = set(nodes)
    unknown = sorted(wanted - set(graph.node_by_name))
    if unknown:
        raise ValueError(f"nodes {unknown[:5]} are not operators of graph {graph.name!r}")
    return [n.name for n in graph.nodes if n.name in wanted]


def _check_pins(graph: OpGraph, pins: Pins, mesh: LogicalMesh, subset: set[str]) -> None:
    """The pins against this mesh (names against the graph are the plan's check)."""
    check_pin_names(pins, graph)
    for node, strategy in pins.strategies:
        if node not in subset:
            continue
        names = strategy_names(graph, node, mesh)
        if strategy not in names:
            shown = ", ".join(repr(n) for n in names[:12]) + (" ..." if len(names) > 12 else "")
            raise InfeasiblePinsError(
                f"pinned strategy {strategy!r} is not a strategy of {node} ({graph.node(node).primitive}) on "
                f"mesh {mesh.shape}; choose one of {shown}"
            )
    for tensor, spec in pins.partition_specs:
        info = graph.tensor(tensor)
        check_spec(info.shape, spec, mesh.shape, mesh.axis_names, what=f"pinned spec of {tensor}")


# ---- problem assembly ---------------------------------------------------------------------


class StepWeights:
    """How often each operator's costs count in one step of `num_microbatches` microbatches.

    Forward and backward run once per microbatch; the update once per step;
    a gradient's reduction across devices once per step (deferred: each
    device accumulates its partial sums and they are reduced at the end).
    """

    def __init__(self, graph: OpGraph, nodes: Sequence[str], num_microbatches: int) -> None:
        self.graph = graph
        self.num_microbatches = num_microbatches
        self.deferred = gradient_producers(graph, nodes) if num_microbatches > 1 else frozenset()
        self._factors: dict[str, tuple[int, int]] = {}  # assembly asks per option: look each node up once

    def factors(self, node: str) -> tuple[int, int]:
        """(how often its compute counts, how often its communication counts) in one step."""
        found = self._factors.get(node)
        if found is None:
            compute = 1 if self.graph.node(node).role == "update" else self.num_microbatches
            found = self._factors[node] = (compute, 1 if node in self.deferred else compute)
        return found

    def compute(self, node: str) -> int:
        return self.factors(node)[0]

    def communication(self, node: str) -> int:
        return self.factors(node)[1]

    def strategy(self, node: str, strategy: Strategy) -> float:
        compute, communication = self.factors(node)
        return compute * strategy.compute_s + communication * strategy.communication_s


def _assemble(graph: OpGraph, simp: Simplified, mesh: LogicalMesh, cost_model: CostModelProtocol,
              pins: Pins, memory_limit: float | None, weights: StepWeights):
    """Costs per group option, class-pair edge costs, alias constraints, memory rows and pin restrictions."""
    unary = [[0.0] * g.num_options for g in simp.groups]
    edges: dict[tuple[str, int], list[tuple[str, int]]] = {}
    reshard = ReshardingPrices(graph, mesh, cost_model)
    for name in simp.nodes:
        if name not in simp.group_of_node:
            continue
        g = simp.group_of_node[name]
        node, strategies, picks = graph.node(name), simp.strategies[name], simp.choice[name]
        per_read = weights.compute(name)
        row = unary[g]
        for k, j in enumerate(picks):
            row[k] += weights.strategy(name, strategies[j])
        for i, raw in enumerate(node.inputs):
            t = simp.resolve(raw)
            if simp.is_free(graph, t):
                continue
            h = simp.group_of_tensor[t]
            if h == g:
                needs = [strategies[j].in_specs[i] for j in picks]
                for k, cost in enumerate(reshard.pairs(t, simp.tensor_specs[t], needs)):
                    row[k] += per_read * cost
            else:
                edges.setdefault((t, g), []).append((name, i))
    by_groups: dict[tuple[int, int], list[tuple[str, list[tuple[str, int]]]]] = {}
    for (t, g), readers in edges.items():
        by_groups.setdefault((simp.group_of_tensor[t], g), []).append((t, readers))
    pairs = []
    for (h, g), items in by_groups.items():
        # One pair per group pair: classes are the tuples of specs across all its tensors.
        have = tuple(zip(*(simp.tensor_specs[t] for t, _ in items)))
        need = tuple(
            tuple(tuple(simp.strategies[n][simp.choice[n][k]].in_specs[i] for n, i in readers)
                  for _, readers in items)
            for k in range(simp.groups[g].num_options)
        )
        sources, targets = _positions(have), _positions(need)
        pairs.append(PairCost(h, g, tuple(sources[c] for c in have), tuple(targets[c] for c in need),
                              _pair_cost(items, list(sources), list(targets), weights, reshard)))
    equal = []
    for param, updated in parameter_aliases(graph):
        updated = simp.resolve(updated)
        if param in simp.group_of_tensor and updated in simp.group_of_tensor and param != updated:
            equal.append(Equal(simp.group_of_tensor[param], simp.group_of_tensor[updated],
                               simp.tensor_specs[param], simp.tensor_specs[updated]))
    restrictions = _restrictions(graph, simp, pins)
    memory = memory_rows(graph, simp, kept_tensors(graph, simp, state_inputs(graph)), mesh)
    allowed = _allowed(simp, restrictions)
    constant = sum(weights.strategy(n, simp.strategies[n][0]) for n in simp.constant_nodes)
    problem = IlpProblem(tuple(map(tuple, unary)), allowed, tuple(pairs), tuple(equal),
                         memory.linear, memory_limit, constant, memory.working_sets)
    return problem, restrictions, memory


def _pair_cost(items: list[tuple[str, list[tuple[str, int]]]], sources: list[tuple], targets: list[tuple],
               weights: StepWeights, reshard: ReshardingPrices) -> np.ndarray:
    """The resharding cost of every (have class, need class) pair, as a [source, target] array.

    A class pair's cost is a sum over its tensors' readers, and each reader sees only a few
    distinct (spec it gets, spec it needs) pairs: price those once, then add them up as arrays.
    """
    total = np.zeros((len(sources), len(targets)))
    for i, (t, readers) in enumerate(items):
        src_index = _positions(src[i] for src in sources)
        for r, (reader, _) in enumerate(readers):
            dst_index = _positions(dst[i][r] for dst in targets)
            table = reshard.table(t, list(src_index), list(dst_index)) * weights.compute(reader)
            total += table[np.ix_([src_index[src[i]] for src in sources], [dst_index[dst[i][r]] for dst in targets])]
    return total


def _positions(values) -> dict:
    """Each distinct value and its position in first-seen order."""
    return {v: j for j, v in enumerate(dict.fromkeys(values))}


def _restrictions(graph: OpGraph, simp: Simplified, pins: Pins) -> list[tuple[str, int, frozenset[int]]]:
    """(pin description, group, allowed options) for every pin that touches this problem."""
    out = []
    for node, strategy in pins.strategies:
        if node not in simp.group_of_node:
            continue
        g = simp.group_of_node[node]
        names = [simp.strategies[node][j].name for j in simp.choice[node]]
        out.append((f"{node} uses {strategy!r}", g, frozenset(k for k, n in enumerate(names) if n == strategy)))
    for tensor, spec in pins.partition_specs:
        t = simp.resolve(tensor)
        if t not in simp.group_of_tensor:
            continue
        g = simp.group_of_tensor[t]
        ok = frozenset(k for k, s in enumerate(simp.tensor_specs[t]) if s == spec)
        out.append((f"{tensor} sharded as {spec_name(spec)} {spec}", g, ok))
    return out


def _allowed(simp: Simplified, restrictions) -> tuple[tuple[int, ...], ...]:
    allowed = [set(range(g.num_options)) for g in simp.groups]
    for _, g, ok in restrictions:
        allowed[g] &= ok
    return tuple(tuple(sorted(a)) for a in allowed)


def _fallback(problem: IlpProblem, result):
    """When the time limit stops the solver empty-handed: the first allowed option everywhere (replicated
    unless pinned), if it satisfies the constraints, marked "heuristic"."""
    choice = tuple(a[0] if a else 0 for a in problem.allowed)
    if all(problem.allowed) and _feasible_fixed(problem, choice):
        return dataclasses.replace(result, choice=choice, status="heuristic")
    return result


# ---- diagnostics --------------------------------------------------------------------------


def _diagnose(problem: IlpProblem, restrictions, memory_limit: float | None, time_limit_s: float,
              mesh: LogicalMesh) -> ShardingInfeasibleError:
    """Say whether the memory limit or which pins make the problem infeasible."""
    free_memory = dataclasses.replace(problem, memory_limit=None)
    if memory_limit is not None and solve(free_memory, time_limit_s).choice is not None:
        lowest = solve(free_memory, time_limit_s, objective="memory")
        need = peak_memory(problem, lowest.choice) if lowest.choice else float("nan")
        return ShardingInfeasibleError.memory(
            need,
            f"memory limit of {memory_limit:.4g} bytes per device is below the {need:.4g} bytes that even the "
            f"most memory-saving sharding needs on mesh {mesh.shape}; raise memory_limit, use a larger mesh, "
            f"or unpin shardings that replicate large tensors"
        )

    def conflicts(kept) -> bool:
        allowed = [set(range(len(u))) for u in free_memory.unary]
        for _, g, ok in kept:
            allowed[g] &= ok
        return not all(allowed) or solve(dataclasses.replace(
            free_memory, allowed=tuple(tuple(sorted(a)) for a in allowed)), time_limit_s).choice is None

    keep = minimal_conflict(restrictions, conflicts)
    if not keep:
        return ShardingInfeasibleError(
            "no sharding satisfies the constraints (a parameter and its update must share a sharding); "
            "this is a bug if no pins are set"
        )
    described = "; ".join(text for text, _, _ in keep)
    return ShardingInfeasibleError(
        f"the pins cannot all hold together (a parameter and its updated value share one sharding, and "
        f"followers take their operand's sharding): {described}; unpin or change one of them"
    )


# ---- the result ---------------------------------------------------------------------------


def _plan(graph: OpGraph, simp: Simplified, mesh: LogicalMesh, cost_model: CostModelProtocol,
          problem: IlpProblem, memory_model: MemoryRows, result, seconds: float, weights: StepWeights) -> ShardingPlan:
    choice = result.choice
    reshard = ReshardingPrices(graph, mesh, cost_model)
    strategies: list[tuple[str, str]] = []
    specs: dict[str, Spec] = {}
    by_role = {"forward": 0.0, "backward": 0.0, "update": 0.0}
    weight_grad = weight_gradient_nodes(graph, simp.nodes)
    weight_grad_s = 0.0  # the part of by_role["backward"] spent on weight gradients only (zero-bubble's W)
    compute = comm = resharding = step_comm = 0.0
    edges: list[tuple[str, str, float]] = []

    def spec_of(t: str) -> Spec:
        return simp.tensor_specs[t][choice[simp.group_of_tensor[t]]]

    for name in simp.nodes:
        node = graph.node(name)
        if node.primitive in IDENTITY or name not in simp.group_of_node:
            first = simp.strategies[name][0]
            strategies.append((name, first.name))
            compute += first.compute_s
            by_role[node.role] += first.compute_s
            weight_grad_s += first.compute_s if name in weight_grad else 0.0
            continue
        strategy = simp.strategies[name][simp.choice[name][choice[simp.group_of_node[name]]]]
        strategies.append((name, strategy.name))
        moved = 0.0
        for i, raw in enumerate(node.inputs):
            t = simp.resolve(raw)
            if t in simp.group_of_tensor:
                specs.setdefault(t, spec_of(t))
            if not simp.is_free(graph, t):
                seconds = reshard(t, spec_of(t), strategy.in_specs[i])
                if seconds > 0:
                    edges.append((name, raw, seconds))
                moved += seconds
        for out in node.outputs:
            specs[out] = spec_of(out)
        compute += strategy.compute_s
        comm += strategy.communication_s
        resharding += moved
        by_role[node.role] += strategy.compute_s + moved
        # A gradient's reduction is deferred to the end of the step: it is update time.
        by_role["update" if name in weights.deferred else node.role] += strategy.communication_s
        if name in weights.deferred:
            step_comm += strategy.communication_s
        if name in weight_grad:
            deferred = name in weights.deferred
            weight_grad_s += strategy.compute_s + moved + (0.0 if deferred else strategy.communication_s)
    for name in simp.nodes:
        node = graph.node(name)
        if node.primitive in IDENTITY:
            for out in node.outputs:
                t = simp.resolve(out)
                if t in simp.group_of_tensor:
                    specs[out] = spec_of(t)
    if len(simp.nodes) == len(graph.nodes):
        # The whole step: inputs no operator reads, and results that are inputs or constants, stay whole.
        for t in graph.inputs + graph.outputs:
            if t not in specs:
                specs[t] = spec_of(t) if t in simp.group_of_tensor else replicated(len(graph.tensor(t).shape))
    memory = memory_model.breakdown(choice)
    cost = ShardingCost(compute, comm, resharding, by_role["forward"], by_role["backward"], by_role["update"],
                        memory.peak, memory.activations, memory, step_communication_s=step_comm,
                        weight_grad_s=weight_grad_s)
    notes = (f"{len(simp.groups)} decision groups from {simp.nodes_before} operators",)
    return ShardingPlan(
        mesh_shape=tuple(mesh.shape),  # type: ignore[arg-type]
        strategies=tuple(strategies),
        partition_specs=tuple(specs.items()),
        objective=evaluate(problem, choice),
        cost=cost,
        status=result.status,
        seconds=seconds,
        num_variables=result.num_variables,
        notes=notes,
        resharding_edges=tuple(edges),
    )


def collective_counts(graph: OpGraph, plan: ShardingPlan, mesh: LogicalMesh) -> dict[str, int]:
    """How many of each collective the plan issues: from strategies and from resharding between them.

    Kinds are XLA's op names (`all-reduce`, `reduce-scatter`, `all-gather`,
    `all-to-all`), so they can be compared with a compiled module's text.
    """

    counts = {"all-reduce": 0, "reduce-scatter": 0, "all-gather": 0, "all-to-all": 0}
    specs = plan.spec_map
    moved: set[tuple[str, Spec]] = set()
    for name, chosen in plan.strategies:
        node = graph.node(name)
        if node.primitive in IDENTITY:
            continue
        options = enumerate_strategies(graph, node, mesh, CostModel(), NAMING_DEVICE)
        strategy = next((s for s in options if s.name == chosen), None)
        if strategy is None:
            raise ValueError(f"the plan's strategy {chosen!r} for {name} is not one of its strategies on mesh "
                             f"{mesh.shape}; was the plan solved for this graph and mesh?")
        for c in strategy.collectives:
            counts[c.kind] += 1
        for tensor, need in zip(node.inputs, strategy.in_specs):
            have = specs.get(tensor)
            if have is None or need is None or have == need or (tensor, need) in moved:
                continue
            moved.add((tensor, need))  # XLA converts a tensor once per target sharding
            step = plan_resharding(have, need)
            counts["all-gather"] += bool(step.gather_axes)
            counts["all-to-all"] += bool(step.all_to_all_axes)
    return counts
