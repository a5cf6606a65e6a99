"""The inter-operator pass: Alpa's stage-construction DP over a table of stage costs.

Pure and numeric: it sees only a `StageCostTable` (the cost of every layer
range on every mesh choice) and the pins turned into `StageConstraints`, and
returns the slicing of the layers into stages and a mesh for each stage that
minimises the pipeline latency

    sum_i (t_i + u_i) + (B - 1) * max_i t_i

where `t_i` is stage i's forward + backward time per microbatch and `u_i` its
once-per-step update (gradient sync, optimizer).  Adding `u_i` to the sum is
an upper bound on the true step (updates of different stages overlap) that
keeps the DP exact.  As in Alpa, `t_max = max_i t_i` is enumerated over the
distinct stage costs; for each, a DP finds the least sum with every stage
under `t_max`, and a branch and bound over the sorted candidates skips every
range of them that provably cannot win.

Placement: stages sit on the devices in pipeline order, each right after
the one before it, so a stage's first device is fixed by the devices the
stages after it use (the DP's state).  A stage inside a host may not
straddle two hosts, a multi-host stage starts at a host's first device, and
a cut between two stages is priced on the link the two devices on either
side of it share: inside a host, or across hosts when the cut falls on a
host's edge.

Memory: a stage fits when `state + in_flight * activations + temporaries <= limit`, where
under 1F1B stage i of n keeps `min(n - i, B)` microbatches in flight and
under GPipe all `B`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from alpaviz.core.inter_op._t_max_search import propose_layouts, search_t_max
from alpaviz.core.inter_op._in_flight import in_flight
from alpaviz.core.plan import INTERLEAVED, SCHEDULE_KINDS, ScheduleKind



@dataclasses.dataclass(frozen=True)
class MeshChoice:
    """A submesh shape (hosts, devices per host), one logical (dp, mp) view of it, and whether the
    stage recomputes its forward in its backward (rematerialisation)."""

    submesh: tuple[int, int]
    logical_shape: tuple[int, int]
    remat: bool = False

    @property
    def num_devices(self) -> int:
        return self.submesh[0] * self.submesh[1]


@dataclasses.dataclass(frozen=True, eq=False)
class StageCostTable:
    """Cost of stage candidates: entry [k, j, m] is layers [k, j) on mesh choice m.

    `time_s` is forward + backward per microbatch (cross-stage transfers
    included), `update_s` once per step, memory in bytes per device:
    `state_bytes` for the whole step, `activation_bytes` per microbatch in
    flight, `temp_bytes` the largest operator's working set (zero when not
    given).  Entries with k >= j or that cannot run are `inf`.
    `layer_work_s`, when given, is a per-layer lower bound on device-seconds
    (time x devices) used to skip hopeless `t_max` values.

    `time_s` leaves out the transfers across a stage's two cuts when
    `cut_in_s` / `cut_back_s` are given: per cut k, the time to receive the
    forward activations (charged to the stage starting at k) and the
    gradients (charged to the stage ending at k), row 0 over the link inside
    a host, row 1 across hosts; either [link, cut] or [link, cut, mesh] when
    the receiving mesh matters (completing the layout after a cross-host
    transfer).  `devices_per_host` enables the placement rules (None: one
    host, no rule).
    """

    meshes: tuple[MeshChoice, ...]
    time_s: np.ndarray
    update_s: np.ndarray
    state_bytes: np.ndarray
    activation_bytes: np.ndarray
    layer_work_s: np.ndarray | None = None
    temp_bytes: np.ndarray | None = None
    cut_in_s: np.ndarray | None = None
    cut_back_s: np.ndarray | None = None
    devices_per_host: int | None = None

    def __post_init__(self) -> None:
        shape = (self.num_layers + 1, self.num_layers + 1, len(self.meshes))
        for name in ("time_s", "update_s", "state_bytes", "activation_bytes"):
            if getattr(self, name).shape != shape:
                raise ValueError(f"StageCostTable.{name} must have shape {shape}, got {getattr(self, name).shape}")
        for name in ("cut_in_s", "cut_back_s"):
            value = getattr(self, name)
            if value is None:
                continue
            per_mesh = (2, self.num_layers + 1, len(self.meshes))
            if value.shape == per_mesh[:2]:  # the same for every receiving mesh
                object.__setattr__(self, name, np.broadcast_to(value[:, :, None], per_mesh))
            elif value.shape != per_mesh:
                raise ValueError(f"StageCostTable.{name} must have shape {per_mesh[:2]} or {per_mesh}, "
                                 f"got {value.shape}")

    @property
    def num_layers(self) -> int:
        return self.time_s.shape[0] - 1

    def at_host_edge(self, device: int | np.ndarray) -> bool | np.ndarray:
        """Whether a cut just before global device `device` falls between two hosts."""
        if self.devices_per_host is None:
            return np.zeros_like(device, dtype=bool) if isinstance(device, np.ndarray) else False
        return device % self.devices_per_host == 0

    def placeable(self, first: int | np.ndarray, size: int) -> bool | np.ndarray:
        """Whether a stage of `size` devices may start at global device `first` (whole hosts start a host;
        a stage inside a host stays inside it)."""
        per_host = self.devices_per_host
        if per_host is None:
            return np.ones_like(first, dtype=bool) if isinstance(first, np.ndarray) else True
        if size >= per_host:
            return first % per_host == 0
        return first // per_host == (first + size - 1) // per_host

    def time_variants(self) -> np.ndarray:
        """Stage times for each pair of cut links: [in_link, back_link, k, j, m] (0 inside a host, 1 across)."""
        zero = np.zeros((2, self.num_layers + 1, len(self.meshes)))
        cut_in = zero if self.cut_in_s is None else self.cut_in_s
        cut_back = zero if self.cut_back_s is None else self.cut_back_s
        return (self.time_s[None, None] + cut_in[:, None, :, None, :] + cut_back[None, :, None, :, :])

    def cut_times(self, stage: "StageChoice", first_device: int) -> tuple[float, float]:
        """What `stage` placed at `first_device` spends per microbatch receiving across its two cuts: the
        forward activations at its start and the gradients at its end, each on the link its cut crosses."""
        after = first_device + self.meshes[stage.mesh].num_devices
        into = (0.0 if self.cut_in_s is None
                else float(self.cut_in_s[int(self.at_host_edge(first_device)), stage.start, stage.mesh]))
        back = (0.0 if self.cut_back_s is None
                else float(self.cut_back_s[int(self.at_host_edge(after)), stage.stop, stage.mesh]))
        return into, back

    def stage_bytes(self, stage: "StageChoice", in_flight: int) -> float:
        """Per-device memory of `stage` holding `in_flight` microbatches: state, activations, temporaries."""
        at = (stage.start, stage.stop, stage.mesh)
        temp = 0.0 if self.temp_bytes is None else float(self.temp_bytes[at])
        return float(self.state_bytes[at]) + in_flight * float(self.activation_bytes[at]) + temp

    def stage_time(self, stage: "StageChoice", first_device: int) -> float:
        """Forward + backward per microbatch of `stage` placed at `first_device`, its cut transfers included."""
        return float(self.time_s[stage.start, stage.stop, stage.mesh]) + sum(self.cut_times(stage, first_device))


def stage_offsets(table: StageCostTable, stages: Sequence["StageChoice"]) -> list[int]:
    """Each stage's first device: stages sit one after another in pipeline order."""
    sizes = [table.meshes[s.mesh].num_devices for s in stages]
    return [int(x) for x in np.cumsum([0, *sizes[:-1]])]


@dataclasses.dataclass(frozen=True)
class StageConstraints:
    """Pins in DP terms: cuts that must or must not be, a stage count, allowed meshes per stage."""

    required_cuts: tuple[int, ...] = ()
    forbidden_cuts: tuple[int, ...] = ()
    num_stages: int | None = None
    stage_meshes: tuple[tuple[int, tuple[int, ...]], ...] = ()


@dataclasses.dataclass(frozen=True)
class StageChoice:
    """One stage of the solution: layers [start, stop) on mesh choice `mesh`."""

    start: int
    stop: int
    mesh: int


@dataclasses.dataclass(frozen=True)
class StageSolution:
    """The DP's answer: stages in order, the latency it minimised and how it searched."""

    stages: tuple[StageChoice, ...]
    objective_s: float
    t_max_s: float
    candidates_tried: int
    candidates_total: int
    # Other layouts for the step simulator to price, in the closed form's order: each the best the
    # search found for one other stage count.
    alternatives: tuple["StageSolution", ...] = ()
    # Stages per submesh: stage j on the submesh of stage j mod (stages / chunks) (interleaved 1F1B).
    chunks: int = 1

    def proposals(self) -> tuple["StageSolution", ...]:
        """This layout, then its alternatives (each with none of its own)."""
        return (dataclasses.replace(self, alternatives=()), *self.alternatives)


class NoStagePlanError(ValueError):
    """No slicing and mesh assignment satisfies the constraints and the memory limit."""


def pipeline_latency(
    times: Sequence[float], updates: Sequence[float], num_microbatches: int
) -> float:
    """sum(t_i + u_i) + (B - 1) * max(t_i): the objective the DP minimises."""
    return float(sum(times) + sum(updates) + (num_microbatches - 1) * max(times))


def solve_stages(
    table: StageCostTable,
    num_devices: int,
    num_microbatches: int,
    schedule: ScheduleKind = "1f1b",
    memory_limit_bytes: float = math.inf,
    constraints: StageConstraints = StageConstraints(),
    tolerance: float = 0.0,
    on_candidate: Callable[[int, int], None] | None = None,
    prefer: Sequence[StageChoice] = (),
    proposals: int = 1,
) -> StageSolution:
    """Slice the layers into stages on meshes covering exactly `num_devices`, minimising latency.

    `tolerance` > 0 lets the search stop once no untried `t_max` can beat the
    best found by more than that fraction: the answer is within a factor
    `1 + tolerance` of the optimum (0 keeps the search exact).
    `on_candidate(tried, total)` reports progress.  Among (near-)equal
    solutions the DP keeps the stages listed in `prefer` (e.g. the previous
    plan's), so a new pin moves only what it must.  With `proposals` > 1 the
    answer carries up to that many layouts in all (`StageSolution.proposals`).

    Raises `NoStagePlanError` when nothing fits.
    """
    if schedule not in SCHEDULE_KINDS or schedule == INTERLEAVED:
        raise ValueError(f"schedule must be one of {[k for k in SCHEDULE_KINDS if k != INTERLEAVED]}, got "
                         f"{schedule!r} (interleaved layouts are cut from 1F1B's: see `interleaved_layouts`)")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    problem = _Problem.build(table, num_devices, num_microbatches, schedule, memory_limit_bytes, constraints)
    problem.prefer(prefer)
    candidates = problem.candidates()
    if candidates.size == 0:
        raise NoStagePlanError("no stage candidate fits the memory limit and the cut pins")
    loose = problem.run(candidates[-1])
    if not math.isfinite(loose.value):
        raise NoStagePlanError(
            f"no slicing of {table.num_layers} layers into stages covering {num_devices} devices fits "
            f"the constraints and the memory limit of {memory_limit_bytes / 2**30:.2f} GiB per device"
        )
    # Feasibility grows with t_max: bisect for the smallest feasible candidate.
    lo, hi = int(np.searchsorted(candidates, problem.work_bound(), side="left")), candidates.size - 1
    lo = min(lo, hi)
    runs = {candidates.size - 1: loose}  # candidate index -> the DP's result under it
    while lo < hi:
        mid = (lo + hi) // 2
        runs[mid] = problem.run(float(candidates[mid]))
        if math.isfinite(runs[mid].value):
            hi = mid
        else:
            lo = mid + 1
    best, tried = search_t_max(problem, candidates, lo, runs, tolerance, on_candidate)
    layouts = []
    for t_max, count in propose_layouts(problem, candidates, runs, best, proposals):
        stages = problem.trace_back(problem.run(t_max, track=True, only_n=count))
        if stages not in layouts:
            layouts.append(stages)
    first, *others = (layout_solution(table, stages, num_microbatches, tried, int(candidates.size))
                      for stages in layouts)
    return dataclasses.replace(first, alternatives=tuple(others))


def layout_solution(table: StageCostTable, stages: tuple[StageChoice, ...], num_microbatches: int,
                    tried: int = 0, total: int = 0) -> StageSolution:
    """`stages` as a solution, priced by the closed form."""
    times = [table.stage_time(s, first) for s, first in zip(stages, stage_offsets(table, stages))]
    updates = [float(table.update_s[s.start, s.stop, s.mesh]) for s in stages]
    return StageSolution(stages=stages, objective_s=pipeline_latency(times, updates, num_microbatches),
                         t_max_s=max(times), candidates_tried=tried, candidates_total=total)


@dataclasses.dataclass
class _RunResult:
    value: float
    n_total: int | None
    choices: list | None = None
    by_stages: dict[int, float] = dataclasses.field(default_factory=dict)  # stage count -> least sum


@dataclasses.dataclass
class _Problem:
    """The DP's arrays, prepared once and reused for every `t_max`."""

    table: StageCostTable
    num_devices: int
    num_microbatches: int
    schedule: ScheduleKind
    times: np.ndarray  # [in_link, back_link, k, j, m]: stage time with its cuts on those links
    sum_cost: np.ndarray  # time + update (same axes), inf where the range is not allowed
    max_in_flight: np.ndarray  # how many microbatches of activations fit beside the state
    groups: tuple[tuple[int, np.ndarray], ...]  # (devices, mesh indices)
    max_stages: int
    constraints: StageConstraints
    # per stage size: ((in_link, back_link), device counts d) where a stage of that size may start at devices - d
    slots: dict[int, tuple[tuple[tuple[int, int], np.ndarray], ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, table, num_devices, num_microbatches, schedule, memory_limit, constraints) -> "_Problem":
        num_layers = table.num_layers
        allowed = np.zeros((num_layers + 1, num_layers + 1), bool)
        for k in range(num_layers):
            allowed[k, k + 1:] = True
        required = [c for c in constraints.required_cuts if 0 < c < num_layers]
        for cut in required:  # no stage may straddle a required cut
            allowed[:cut, cut + 1:] = False
        for cut in constraints.forbidden_cuts:
            if 0 < cut < num_layers:
                allowed[cut, :] = False
                allowed[:, cut] = False
        times = table.time_variants()
        sum_cost = np.where(allowed[:, :, None], times + table.update_s, np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            fixed = table.state_bytes if table.temp_bytes is None else table.state_bytes + table.temp_bytes
            free = np.where(np.isfinite(fixed), memory_limit - fixed, -np.inf)
            fit = np.where(table.activation_bytes > 0, np.floor(free / table.activation_bytes), np.inf)
        max_in_flight = np.where(free >= 0, fit, -1.0)
        sum_cost = np.where(max_in_flight >= 1, sum_cost, np.inf)
        devices = np.array([m.num_devices for m in table.meshes])
        groups = tuple((int(c), np.flatnonzero(devices == c)) for c in sorted(set(devices.tolist())))
        max_stages = min(num_layers, num_devices)
        if constraints.num_stages is not None:
            max_stages = min(max_stages, constraints.num_stages)
        used = np.arange(num_devices + 1)
        first = num_devices - used
        slots = {}
        for size, _ in groups:
            ok = (used >= size) & table.placeable(first, size)
            links = np.stack([table.at_host_edge(first), table.at_host_edge(first + size)], axis=1).astype(int)
            pairs = sorted({(int(a), int(b)) for a, b in links[ok]})
            slots[size] = tuple(((a, b), np.flatnonzero(ok & (links[:, 0] == a) & (links[:, 1] == b)))
                                for a, b in pairs)
        return cls(table, num_devices, num_microbatches, schedule, times, sum_cost, max_in_flight, groups,
                   max_stages, constraints, slots)

    def prefer(self, stages: Sequence[StageChoice]) -> None:
        """Make every stage not in `stages` a hair dearer, so ties keep the preferred ones."""
        if not stages:
            return
        finite = self.sum_cost[np.isfinite(self.sum_cost)]
        if finite.size == 0:
            return
        penalty = np.full(self.sum_cost.shape[2:], 1e-9 * float(finite.max()))
        for s in stages:
            if 0 <= s.start < s.stop <= self.table.num_layers and 0 <= s.mesh < len(self.table.meshes):
                penalty[s.start, s.stop, s.mesh] = 0.0
        self.sum_cost = self.sum_cost + penalty

    def candidates(self) -> np.ndarray:
        return np.unique(self.times[np.isfinite(self.sum_cost)])

    def work_bound(self) -> float:
        """A lower bound on t_max from the device-seconds every layer needs."""
        if self.table.layer_work_s is None:
            return 0.0
        return float(np.sum(self.table.layer_work_s)) / self.num_devices

    def run(self, t_max: float, track: bool = False, only_n: int | None = None) -> _RunResult:
        """Least sum of stage costs with every stage under `t_max` (inf when none)."""
        c = self.constraints
        if only_n is not None:
            return self._run_fixed(t_max, only_n, track)
        if self.schedule == "zb-h1" and c.num_stages is None and not c.stage_meshes:
            return self._run_by_count(t_max, track)
        if c.stage_meshes and c.num_stages is None:
            # A mesh pinned on stage k only holds in plans of more than k stages (under any schedule, ZB-H1's
            # memory rule included: each count's run applies it).
            fewest = max(stage for stage, _ in c.stage_meshes) + 1
            best, by_stages = _RunResult(math.inf, None), {}
            for n_total in range(fewest, self.max_stages + 1):
                result = self._run_fixed(t_max, n_total, track)
                by_stages.update(result.by_stages)
                if result.value < best.value:
                    best = result
            return dataclasses.replace(best, by_stages=by_stages)
        return self._run_fixed(t_max, c.num_stages, track)

    def _run_by_count(self, t_max: float, track: bool) -> _RunResult:
        """ZB-H1's run: one DP per stage count (every stage holds min(n, B) microbatches), in order of a bound.

        1F1B's memory rule (min(n - i, B) on stage i) asks less of every stage, so its least sum for n
        stages bounds ZB-H1's from below; counts are tried from the smallest bound and the search stops
        once no bound beats the best found.  Counts left untried are absent from `by_stages`.
        """
        bound = self._run_fixed(t_max, None, False, memory_rule="1f1b").by_stages
        best, by_stages = _RunResult(math.inf, None), {}
        for n_total in sorted(bound, key=bound.__getitem__):
            if bound[n_total] >= best.value:
                break
            result = self._run_fixed(t_max, n_total, track)
            by_stages.update(result.by_stages)
            if result.value < best.value:
                best = result
        return dataclasses.replace(best, by_stages=by_stages)

    def _run_fixed(self, t_max: float, n_total: int | None, track: bool,
                   memory_rule: ScheduleKind | None = None) -> _RunResult:
        """The DP with `n_total` stages (None: any count); `memory_rule` replaces the schedule's in-flight rule."""
        num_layers, devices, B = self.table.num_layers, self.num_devices, self.num_microbatches
        rule = memory_rule or self.schedule
        under = self.times <= t_max
        stage_meshes = dict(self.constraints.stage_meshes)
        previous = np.full((num_layers + 1, devices + 1), np.inf)
        previous[num_layers, 0] = 0.0
        best, best_n = math.inf, None
        choices: list = []
        by_stages: dict[int, float] = {}
        last_s = n_total if n_total is not None else self.max_stages
        for s in range(1, last_s + 1):
            q = in_flight(last_s - s, last_s, B, rule)
            cost = np.where(under & (self.max_in_flight >= q), self.sum_cost, np.inf)
            if n_total is not None and (n_total - s) in stage_meshes:
                keep = np.zeros(len(self.table.meshes), bool)
                keep[list(stage_meshes[n_total - s])] = True
                cost = np.where(keep, cost, np.inf)
            current, choice = self._step(cost, previous, track)
            choices.append(choice)
            if n_total is None or s == n_total:
                if np.isfinite(current[0, devices]):
                    by_stages[s] = float(current[0, devices])
                if current[0, devices] < best:
                    best, best_n = float(current[0, devices]), s
            previous = current
            if not np.isfinite(current).any():
                break
        if n_total is not None:
            best_n = n_total if math.isfinite(best) else None
        return _RunResult(best, best_n, choices if track else None, by_stages)

    def _step(self, cost: np.ndarray, previous: np.ndarray, track: bool):
        """One more stage in front: F[k, d] = min_{j, m} cost[k, j, m] + F_prev[j, d - devices(m)].

        The new stage starts at device `devices - d`; that fixes whether it may sit there and the
        links of its two cuts (`cost` has one [k, j, m] slice per pair of links)."""
        num_layers, devices = self.table.num_layers, self.num_devices
        current = np.full((num_layers + 1, devices + 1), np.inf)
        best_j = np.zeros(current.shape, np.int64) if track else None
        best_m = np.zeros(current.shape, np.int64) if track else None
        for size, members in self.groups:
            if not self.slots[size]:  # nowhere to start a stage of this size (e.g. larger than the cluster)
                continue
            shifted = np.full_like(previous, np.inf)
            shifted[:, size:] = previous[:, : devices + 1 - size]
            if not track:  # the hot path: each pair of links only over the device counts where it occurs
                for (a, b), ds in self.slots[size]:
                    per_range = cost[a, b][:, :, members].min(axis=-1)  # (k, j)
                    best = (per_range[:, :, None] + shifted[None, :, ds]).min(axis=1)  # (k, len(ds))
                    current[:, ds] = np.minimum(current[:, ds], best)
                continue
            group_cost = cost[..., members]  # (in_link, back_link, k, j, members)
            per_range, which = group_cost.min(axis=-1), group_cost.argmin(axis=-1)
            per_d = np.full((devices + 1, num_layers + 1, num_layers + 1), np.inf)  # (d, k, j)
            m_of = np.zeros(per_d.shape, np.int64)
            for (a, b), ds in self.slots[size]:
                per_d[ds], m_of[ds] = per_range[a, b], which[a, b]
            total = per_d.transpose(1, 2, 0) + shifted[None, :, :]  # (k, j, d)
            j_best = total.argmin(axis=1)  # (k, d)
            value = np.take_along_axis(total, j_best[:, None, :], axis=1)[:, 0, :]
            better = value < current
            current = np.where(better, value, current)
            k_index, d_index = np.arange(num_layers + 1)[:, None], np.arange(devices + 1)[None, :]
            m_best = members[m_of[d_index, k_index, j_best]]
            best_j = np.where(better, j_best, best_j)
            best_m = np.where(better, m_best, best_m)
        return current, ((best_j, best_m) if track else None)

    def trace_back(self, result: _RunResult) -> tuple[StageChoice, ...]:
        n = result.n_total
        if n is None or result.choices is None:
            raise NoStagePlanError("the stage DP found no solution to trace back")
        stages = []
        k, d = 0, self.num_devices
        for s in range(n, 0, -1):
            best_j, best_m = result.choices[s - 1]
            j, m = int(best_j[k, d]), int(best_m[k, d])
            stages.append(StageChoice(k, j, m))
            k, d = j, d - self.table.meshes[m].num_devices
        if k != self.table.num_layers or d != 0:
            raise NoStagePlanError(f"the stage DP traced back to layer {k} with {d} devices left")
        return tuple(stages)


def is_feasible(
    table: StageCostTable,
    num_devices: int,
    num_microbatches: int,
    schedule: ScheduleKind = "1f1b",
    memory_limit_bytes: float = math.inf,
    constraints: StageConstraints = StageConstraints(),
) -> bool:
    """Whether any slicing and mesh assignment satisfies the constraints and the memory limit."""
    problem = _Problem.build(table, num_devices, num_microbatches, schedule, memory_limit_bytes, constraints)
    return math.isfinite(problem.run(math.inf).value)
