"""The plan: a frozen, JSON round-trippable record shared by solvers, runtime and widgets.

A plan holds only plain data (ints, floats, strings, tuples).  It names
operators and tensors of an `OpGraph` by their names and carries a
fingerprint of that graph so a plan is never applied to another model.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
from typing import Literal, Mapping

from alpaviz.core.cost import Cluster, CostModel
from alpaviz.core.graph import OpGraph, check_int, check_number
from alpaviz.core.plan._memory import MemoryBreakdown
from alpaviz.core.plan._instructions import INTERLEAVED, SCHEDULE_KINDS, check_chunks
from alpaviz.core.plan._pins import Pins
from alpaviz.core.plan._serde import PlanFormatError, from_jsonable, load_json, to_jsonable
from alpaviz.core.plan._spec import Spec, check_spec, spec_name

SCHEMA_VERSION = 1
# The pipeline schedules (`SCHEDULE_KINDS`, see `compute_order`).
ScheduleKind = Literal["1f1b", "gpipe", "zb-h1", "interleaved-1f1b"]
# How a statistic over the batch (BatchNorm's mean and variance) is taken when the batch is split into
# microbatches: over the global batch (a step whose statistics feed back into per-example work is then
# refused with several microbatches), or per microbatch (ghost batch norm: each microbatch its own).
BatchStatistics = Literal["global", "per_microbatch"]
BATCH_STATISTICS: tuple[str, ...] = ("global", "per_microbatch")
MAX_MICROBATCHES = 1 << 16  # far beyond any real pipeline; keeps a hostile plan from exhausting memory
SolverStatus = Literal["optimal", "time_limited", "pinned", "heuristic"]


@dataclasses.dataclass(frozen=True)
class Layer:
    """A group of operators that always land in the same stage, and what it costs on its stage's mesh
    (per microbatch: compute, communication and resharding, the parts of the stage's time it adds; its
    peak memory per device).  Costs are zero where the plan was not priced (a hand-made plan)."""

    index: int
    nodes: tuple[str, ...]
    flops: float
    compute_s: float = 0.0
    communication_s: float = 0.0
    resharding_s: float = 0.0
    memory_bytes: float = 0.0

    def __post_init__(self) -> None:
        check_int("layer index", self.index, minimum=0)
        for field in ("flops", "compute_s", "communication_s", "resharding_s", "memory_bytes"):
            check_number(f"layer {self.index} {field}", getattr(self, field), minimum=0)


@dataclasses.dataclass(frozen=True)
class StageCost:
    """Predicted cost of one stage for one microbatch, and its per-device memory.

    `memory_bytes` is the stage's predicted peak (`memory.peak`: state, the
    activations of the microbatches the schedule keeps in flight, and the
    largest operator's working set); `memory` splits it.  `recv_forward_s`,
    `recv_backward_s` and `recv_update_s` are the parts of `forward_s`,
    `backward_s` and `update_s` spent receiving from other stages;
    `step_communication_s` the part of `communication_s` paid once per step
    (gradient reductions, `recv_update_s`), the rest being per microbatch.
    `weight_grad_s` is the part of `backward_s` that only computes weight
    gradients: what a zero-bubble schedule runs apart, later (its W).
    """

    forward_s: float
    backward_s: float
    update_s: float
    compute_s: float
    communication_s: float
    resharding_s: float
    memory_bytes: float
    activation_bytes: float = 0.0
    memory: MemoryBreakdown = MemoryBreakdown()
    recv_forward_s: float = 0.0
    recv_backward_s: float = 0.0
    recv_update_s: float = 0.0
    step_communication_s: float = 0.0
    weight_grad_s: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name != "memory":
                check_number(f"stage cost {field.name}", getattr(self, field.name), minimum=0, allow_inf=True)

    @property
    def microbatch_s(self) -> float:
        """Forward plus backward time of one microbatch: the `t_i` of the pipeline formula."""
        return self.forward_s + self.backward_s


@dataclasses.dataclass(frozen=True)
class Stage:
    """A contiguous range of layers on a submesh, with its sharding decisions."""

    index: int
    layer_start: int
    layer_stop: int
    submesh: tuple[int, int]
    device_ids: tuple[int, ...]
    logical_mesh: tuple[int, int]
    strategies: tuple[tuple[str, str], ...]
    partition_specs: tuple[tuple[str, Spec], ...]
    cost: StageCost
    # Recompute the forward inside the backward: only the stage's inputs stay per microbatch in flight.
    remat: bool = False
    # (operator, operand tensor, seconds per microbatch): where the ILP's resharding time is spent
    resharding_edges: tuple[tuple[str, str, float], ...] = ()

    def __post_init__(self) -> None:
        check_int("stage index", self.index, minimum=0)
        where = f"stage {self.index}"
        check_int(f"{where} layer_start", self.layer_start, minimum=0)
        check_int(f"{where} layer_stop", self.layer_stop, minimum=0)
        if not self.layer_start < self.layer_stop:
            raise ValueError(f"{where}: empty layer range [{self.layer_start}, {self.layer_stop})")
        for what, shape in (("submesh", self.submesh), ("logical_mesh", self.logical_mesh)):
            for size in shape:
                check_int(f"{where} {what}", size, minimum=1)
        for d in self.device_ids:
            check_int(f"{where} device id", d, minimum=0)
        if len(set(self.device_ids)) != len(self.device_ids):
            raise ValueError(f"{where}: device ids {list(self.device_ids)} repeat a device; each must be distinct")
        for what, shape in (("submesh", self.submesh), ("logical mesh", self.logical_mesh)):
            if shape[0] * shape[1] != len(self.device_ids):
                raise ValueError(f"{where}: {what} {shape} does not match {len(self.device_ids)} device ids")

    @property
    def layers(self) -> range:
        """The layer indices this stage runs, as a range."""
        return range(self.layer_start, self.layer_stop)

    @property
    def strategy_map(self) -> Mapping[str, str]:
        """This stage's strategies as a dict, operator name to strategy name."""
        return dict(self.strategies)

    @property
    def spec_map(self) -> Mapping[str, Spec]:
        """This stage's partition specs as a dict, tensor name to spec."""
        return dict(self.partition_specs)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Pipeline schedule, microbatch count, how batch statistics are taken (see `BatchStatistics`), and
    how many stages (model chunks) each submesh holds: more than one only under interleaved 1F1B, where
    stage j runs on the submesh of stage j mod (stages / chunks)."""

    kind: ScheduleKind = "1f1b"
    num_microbatches: int = 1
    batch_statistics: BatchStatistics = "global"
    chunks: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"schedule kind must be one of {list(SCHEDULE_KINDS)}, got {self.kind!r}")
        check_int("num_microbatches", self.num_microbatches, minimum=1, maximum=MAX_MICROBATCHES)
        check_int("chunks", self.chunks, minimum=1, maximum=MAX_MICROBATCHES)
        if (self.chunks > 1) != (self.kind == INTERLEAVED):
            raise ValueError(f"schedule {self.kind!r} with {self.chunks} chunks per submesh: interleaved 1F1B "
                             f"runs 2 or more chunks per submesh, every other schedule one")
        if self.batch_statistics not in BATCH_STATISTICS:
            raise ValueError(
                f"batch_statistics must be one of {list(BATCH_STATISTICS)}, got {self.batch_statistics!r}: "
                f"'global' keeps jax.jit's numbers, 'per_microbatch' normalises each microbatch by its own"
            )

    @property
    def label(self) -> str:
        """The kind, with its chunks per submesh when interleaved: "interleaved-1f1b (2 chunks)"."""
        return f"{self.kind} ({self.chunks} chunks)" if self.chunks > 1 else self.kind

    @property
    def statistics_note(self) -> str:
        """", batch statistics per microbatch" for ghost batch norm, else "": how every view names the opt-in."""
        return ", batch statistics per microbatch" if self.batch_statistics == "per_microbatch" else ""


@dataclasses.dataclass(frozen=True)
class PredictedCost:
    """The plan's predicted step: total time and where it goes."""

    step_time_s: float
    compute_s: float
    communication_s: float
    resharding_s: float
    cross_stage_s: float
    bubble_s: float
    max_memory_bytes: float
    memory_limit_bytes: float

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_number(f"predicted {field.name}", getattr(self, field.name), minimum=0, allow_inf=True)


@dataclasses.dataclass(frozen=True)
class SolverInfo:
    """How the plan was found: status, seconds, objective and any notes.

    `seconds` and `timings` (how long each phase took, what came from a cache)
    describe this run, not the plan: two solves of one problem give equal plans.
    """

    status: SolverStatus
    seconds: float = dataclasses.field(compare=False)
    objective: float
    notes: tuple[str, ...] = ()
    timings: tuple[str, ...] = dataclasses.field(default=(), compare=False)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A complete parallel plan: layers, stages on submeshes, shardings, schedule, costs, pins.

    Example:
        >>> plan = av.solve(train_step, params, batch, cluster=av.Cluster.a100_node(2))
        >>> text = plan.to_json(); assert av.Plan.from_json(text) == plan
    """

    model: str
    graph_fingerprint: str
    cluster: Cluster
    cost_model: CostModel
    layers: tuple[Layer, ...]
    stages: tuple[Stage, ...]
    schedule: Schedule
    predicted: PredictedCost
    pins: Pins
    solver: SolverInfo
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise PlanFormatError(
                f"plan.schema_version: this alpaviz reads version {SCHEMA_VERSION}, got "
                f"{self.schema_version}; re-solve the plan with this version"
            )
        if not self.stages:
            raise ValueError("a plan has at least one stage; this one has none")
        for i, layer in enumerate(self.layers):
            if layer.index != i:
                raise ValueError(f"layer {i} is numbered {layer.index}: layers are numbered 0, 1, ... in order")
        expected = 0
        for i, stage in enumerate(self.stages):
            if stage.index != i or stage.layer_start != expected:
                raise ValueError(
                    f"stage {i} covers layers [{stage.layer_start}, {stage.layer_stop}) but should start "
                    f"at layer {expected}: stages must tile the layers in order"
                )
            expected = stage.layer_stop
        if expected != len(self.layers):
            raise ValueError(f"the stages cover {expected} layers but the plan has {len(self.layers)}")
        check_chunks(self.schedule.kind, self.num_stages, self.schedule.num_microbatches, self.schedule.chunks)
        self._check_devices()

    def _check_devices(self) -> None:
        """Each stage on a real submesh of the cluster; no device in two submeshes; under interleaved 1F1B
        stage j on the very submesh (devices and logical mesh) of stage j mod p."""
        owner: dict[int, int] = {}
        per_host = self.cluster.devices_per_host
        p = self.num_submeshes
        for stage in self.stages[p:]:
            home = self.stages[stage.index % p]
            if (stage.device_ids, stage.submesh, stage.logical_mesh) != (home.device_ids, home.submesh,
                                                                          home.logical_mesh):
                raise ValueError(
                    f"stage {stage.index} is chunk {stage.index // p} of submesh {stage.index % p} under "
                    f"interleaved 1F1B, so it runs on stage {home.index}'s devices {list(home.device_ids)} as "
                    f"{home.logical_mesh}; it has {list(stage.device_ids)} as {stage.logical_mesh}"
                )
        for stage in self.stages[:p]:
            self.cluster.validate_submesh(stage.submesh)
            for d in stage.device_ids:
                if d >= self.cluster.num_devices:
                    raise ValueError(
                        f"stage {stage.index} uses device {d}, but cluster {self.cluster.name!r} has "
                        f"{self.cluster.num_devices} devices (ids 0..{self.cluster.num_devices - 1})"
                    )
            hosts = {d // per_host for d in stage.device_ids}
            if len(hosts) != stage.submesh[0]:
                raise ValueError(
                    f"stage {stage.index}: submesh {stage.submesh} spans {stage.submesh[0]} host(s) but its "
                    f"device ids {list(stage.device_ids)} sit on hosts {sorted(hosts)} ({per_host} devices per host)"
                )
            for d in stage.device_ids:
                if d in owner:
                    raise ValueError(f"device {d} is in stage {owner[d]} and stage {stage.index}; stages "
                                     f"must use disjoint devices")
                owner[d] = stage.index

    # ---- views -----------------------------------------------------------
    @property
    def num_stages(self) -> int:
        """How many pipeline stages the plan has."""
        return len(self.stages)

    @property
    def num_submeshes(self) -> int:
        """How many disjoint submeshes the stages run on: the stage count over the chunks per submesh."""
        return len(self.stages) // self.schedule.chunks

    def submesh_of(self, stage: int) -> int:
        """The submesh (the instruction list, the timeline's row) that runs `stage`."""
        return stage % self.num_submeshes

    def chunk_of(self, stage: int) -> int:
        """Which of its submesh's stages `stage` is (0 unless interleaved)."""
        return stage // self.num_submeshes

    @property
    def stage_cuts(self) -> tuple[int, ...]:
        """The layers where a stage starts, first stage excluded."""
        return tuple(stage.layer_start for stage in self.stages[1:])

    @functools.cached_property
    def strategies(self) -> Mapping[str, str]:
        """Operator -> strategy over every stage (built once per plan: views ask for it per operator)."""
        return types.MappingProxyType({n: s for stage in self.stages for n, s in stage.strategies})

    def stage_of_layer(self, layer: int) -> Stage:
        """The stage that runs `layer`; a KeyError gives the plan's layer count if none does."""
        for stage in self.stages:
            if layer in stage.layers:
                return stage
        raise KeyError(f"layer {layer} is not in the plan (it has {len(self.layers)} layers)")

    def stage_of_node(self, node: str) -> Stage:
        """The stage that runs the operator `node`; a KeyError says so if no layer holds it."""
        for layer in self.layers:
            if node in layer.nodes:
                return self.stage_of_layer(layer.index)
        raise KeyError(f"operator {node!r} is not in the plan")

    def check_graph(self, graph: OpGraph) -> None:
        """Raise PlanFormatError unless this plan was made for `graph` and every name in it is real.

        Checks the fingerprint, that the layers hold every operator exactly
        once, and that each partition spec names a tensor of the graph and
        divides it on its stage's logical mesh.
        """
        if graph_fingerprint(graph) != self.graph_fingerprint:
            raise PlanFormatError(
                f"plan.graph_fingerprint: this plan was made for model {self.model!r} with a different "
                f"operator graph; re-solve it for the graph of {graph.name!r}"
            )
        seen: dict[str, int] = {}
        for layer in self.layers:
            for name in layer.nodes:
                if name not in graph.node_by_name:
                    raise PlanFormatError(f"plan.layers[{layer.index}]: no operator named {name!r} in the graph")
                if name in seen:
                    raise PlanFormatError(f"plan.layers[{layer.index}]: operator {name!r} is also in layer {seen[name]}")
                seen[name] = layer.index
        missing = [n.name for n in graph.nodes if n.name not in seen]
        if missing:
            raise PlanFormatError(f"plan.layers: {len(missing)} operators are in no layer (e.g. {missing[:3]})")
        for stage in self.stages:
            for name, _ in stage.strategies:
                if name not in graph.node_by_name:
                    raise PlanFormatError(f"plan.stages[{stage.index}].strategies: no operator named {name!r}")
            for name, spec in stage.partition_specs:
                if name not in graph.tensor_by_name:
                    raise PlanFormatError(f"plan.stages[{stage.index}].partition_specs: no tensor named {name!r}")
                try:
                    check_spec(graph.tensor(name).shape, spec, stage.logical_mesh, what=f"tensor {name!r}")
                except ValueError as err:
                    raise PlanFormatError(f"plan.stages[{stage.index}].partition_specs: {err}") from None

    def summary(self) -> str:
        """A readable table of stages, meshes, times and memory."""
        p = self.predicted
        lines = [
            f"Plan for {self.model!r} on {self.cluster.name} ({self.cluster.num_devices} devices), "
            f"{self.schedule.label} x {self.schedule.num_microbatches} microbatches{self.schedule.statistics_note}",
            f"  predicted step {p.step_time_s * 1e3:.3f} ms  (compute {p.compute_s * 1e3:.3f}, comm "
            f"{p.communication_s * 1e3:.3f}, reshard {p.resharding_s * 1e3:.3f}, cross-stage "
            f"{p.cross_stage_s * 1e3:.3f}, bubble {p.bubble_s * 1e3:.3f} ms)",
            f"  max memory/device {format_bytes(p.max_memory_bytes)} of {format_bytes(p.memory_limit_bytes)};"
            f" solver {self.solver.status} in {self.solver.seconds:.2f} s",
            f"  {'stage':>5} {'layers':>9} {'submesh':>8} {'logical':>8} {'fwd ms':>9} {'bwd ms':>9} "
            f"{'memory':>10}  shardings",
        ]
        for s in self.stages:
            names = sorted({spec_name(spec) for _, spec in s.partition_specs})
            lines.append(
                f"  {s.index:>5} {f'{s.layer_start}-{s.layer_stop - 1}':>9} "
                f"{f'{s.submesh[0]}x{s.submesh[1]}':>8} {f'{s.logical_mesh[0]}x{s.logical_mesh[1]}':>8} "
                f"{s.cost.forward_s * 1e3:>9.3f} {s.cost.backward_s * 1e3:>9.3f} "
                f"{format_bytes(s.cost.memory_bytes):>10}  {', '.join(names[:4])}"
                + ("  (remat: forward recomputed in the backward)" if s.remat else "")
            )
        for line in self.pins.describe():
            lines.append(f"  pinned: {line}")
        for note in self.solver.notes:
            lines.append(f"  note: {note}")
        for timing in self.solver.timings:
            lines.append(f"  timing: {timing}")
        return "\n".join(lines)

    # ---- edits and JSON -------------------------------------------------
    def with_pins(self, pins: Pins) -> "Plan":
        """The same plan recording other pins (re-solve to honour them)."""
        return dataclasses.replace(self, pins=pins)

    def with_batch_statistics(self, how: BatchStatistics) -> "Plan":
        """The same plan taking batch statistics `how` ("per_microbatch": ghost batch norm, recorded here)."""
        return dataclasses.replace(self, schedule=dataclasses.replace(self.schedule, batch_statistics=how))

    def to_json(self, indent: int | None = None) -> str:
        """The whole plan as JSON text, read back by `Plan.from_json`."""
        return json.dumps(to_jsonable(self), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """Parse a plan, refusing malformed JSON or a field that breaks the schema."""
        data = load_json(text, "plan")
        if not isinstance(data, dict):
            raise PlanFormatError(f"plan: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlanFormatError(
                f"plan.schema_version: this alpaviz reads version {SCHEMA_VERSION}, got {version!r}"
            )
        stages, layers = data.get("stages"), data.get("layers")
        if isinstance(stages, list) and isinstance(layers, list) and len(stages) > max(len(layers), 1):
            # Checked before decoding: each stage holds at least one layer, and decoding 100k of them takes seconds.
            raise PlanFormatError(f"plan.stages: {len(stages)} stages for {len(layers)} layers; each stage holds at "
                                  f"least one layer")
        return from_jsonable(cls, data, "plan")


def format_bytes(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps a leading digit: '1.50 GiB', '640.00 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def graph_fingerprint(graph: OpGraph) -> str:
    """A short hash of the graph's structure (operators, shapes, wiring)."""
    digest = hashlib.sha256()
    for node in graph.nodes:
        digest.update(f"{node.name}|{node.inputs}|{node.outputs}".encode())
    for tensor in graph.tensors:
        digest.update(f"{tensor.name}|{tensor.shape}|{tensor.dtype}".encode())
    return digest.hexdigest()[:16]
