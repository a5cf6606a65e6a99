"""`solve`'s options as one frozen value, checked once, passed whole to every caller of the solver.

The microbatch-count search, the baselines, `resolve` and the editor's
session hand a `SolveOptions` on (changing a field with `replace`), so an
option added here reaches all of them; none re-lists the keywords.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Literal, Sequence

from alpaviz.core.cost import CostModel
from alpaviz.core.graph import check_int, check_number
from alpaviz.core.inter_op._progress import ProgressFn
from alpaviz.core.inter_op._stage_cost import StageCostFn
from alpaviz.core.inter_op._stage_dp import ScheduleKind
from alpaviz.core.inter_op._profile_cache import StageProfileCache
from alpaviz.core.inter_op._profile_workers import ProfileWorkers
from alpaviz.core.plan import INTERLEAVED, Pins, Plan, Schedule


@dataclasses.dataclass(frozen=True)
class SolveOptions:
    """Every choice of `solve` beside the step and the cluster.

    * `cost_model`: how operators and links are priced (default `CostModel()`).
    * `num_microbatches`: microbatches per step, or "auto" to try every count that divides the
      global batch (needs `global_batch_argnums`); a count in `pins` fixes it instead.
    * `schedule`: the pipeline schedule, "1f1b", "gpipe", "zb-h1" (zero bubble: each backward split into
      the input gradient and the weight gradient, W filling the bubbles), "interleaved-1f1b" (several
      stages per submesh, their number searched), or "auto" to plan under each and keep the fastest
      simulated step; a schedule in `pins` fixes it instead.
    * `pins`: the decisions the user fixed.
    * `memory_limit`: bytes per device (default: the device's memory).
    * `cache`: a `StageProfileCache`, which makes re-solving after a pin cheap.
    * `progress`: tqdm bars on a terminal (True), none (False), or `progress(phase, done, total)`.
    * `num_layers`: merge or cluster the graph's layers into this many.
    * `stage_cost`: the per-layer cost (default: the intra-op ILP; `analytic_stage_cost` is closed-form).
    * `profile`: measure each candidate on the local devices instead of pricing it.
    * `submeshes`: the submesh shapes stages may take (default: all the cluster allows).
    * `tolerance`: the optimality gap the stage DP may leave (0: exact).
    * `simulated_layouts`: how many of the stage DP's layouts the step simulator prices (the DP's best
      under its closed form, then the best it found for each other stage count); the fastest simulated
      step is the plan.  1 leaves the choice to the closed form.
    * `previous`: a plan of the same graph; ties break towards its stages, so a pin moves only what it must.
    * `workers`: processes that profile layers, or a running `ProfileWorkers` pool shared across solves.
    * `global_batch_argnums`: the arguments that hold the global batch, split into microbatches before tracing.

    The cache, the progress reporter, the workers and the previous plan steer how the solve runs, not
    what it answers, so they take no part in equality.
    """

    cost_model: CostModel = CostModel()
    num_microbatches: int | Literal["auto"] = 1
    schedule: ScheduleKind | Literal["auto"] = "1f1b"
    pins: Pins = Pins()
    memory_limit: float | None = None
    cache: StageProfileCache | None = dataclasses.field(default=None, compare=False)
    progress: bool | ProgressFn = dataclasses.field(default=True, compare=False)
    num_layers: int | None = None
    stage_cost: StageCostFn | None = None
    profile: bool = False
    submeshes: tuple[tuple[int, int], ...] | None = None
    tolerance: float = 0.0
    simulated_layouts: int = 4
    previous: Plan | None = dataclasses.field(default=None, compare=False)
    workers: int | ProfileWorkers = dataclasses.field(default=1, compare=False)
    global_batch_argnums: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if self.cost_model is None:
            set_("cost_model", CostModel())
        if self.pins is None:
            set_("pins", Pins())
        if not isinstance(self.pins, Pins):
            raise TypeError(f"pins must be an av.Pins, got {type(self.pins).__name__}")
        if self.pins.num_microbatches is not None:
            set_("num_microbatches", self.pins.num_microbatches)
        if self.pins.schedule is not None:
            set_("schedule", self.pins.schedule)
        if self.schedule != "auto":  # the kind and the count, checked as the plan's Schedule checks them
            Schedule(self.schedule, 1 if self.num_microbatches == "auto" else self.num_microbatches,
                     chunks=2 if self.schedule == INTERLEAVED else 1)
        elif self.num_microbatches != "auto":
            Schedule("1f1b", self.num_microbatches)
        if self.memory_limit is not None:
            check_number("memory_limit (bytes per device)", self.memory_limit, positive=True)
        if self.num_layers is not None:
            check_int("num_layers", self.num_layers, minimum=1)
        if not isinstance(self.workers, ProfileWorkers):
            check_int("workers", self.workers, minimum=1)
        else:
            self.workers.check_open()
        check_number("tolerance", self.tolerance, minimum=0)
        check_int("simulated_layouts", self.simulated_layouts, minimum=1)
        if self.submeshes is not None:
            set_("submeshes", tuple(tuple(s) if isinstance(s, (tuple, list)) else s for s in self.submeshes))
        set_("global_batch_argnums", tuple(self.global_batch_argnums))
        for argnum in self.global_batch_argnums:
            check_int("an entry of global_batch_argnums", argnum, minimum=0)
        if self.previous is not None and not isinstance(self.previous, Plan):
            raise TypeError(f"previous must be an av.Plan, got {type(self.previous).__name__}")
        if not isinstance(self.progress, bool) and not callable(self.progress):
            raise TypeError(f"progress must be True, False or a function (phase, done, total), got {self.progress!r}")

    def replace(self, **changes: Any) -> "SolveOptions":
        """These options with some changed (unknown names refused with the known ones)."""
        unknown = sorted(set(changes) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(f"unknown solve option(s) {unknown}; the options are {list(OPTION_NAMES)}")
        return dataclasses.replace(self, **changes) if changes else self

    @classmethod
    def of(cls, options: "SolveOptions | None", **changes: Any) -> "SolveOptions":
        """`options` (or the defaults) with `changes` applied: how every keyword-taking entry point reads its options."""
        if options is not None and not isinstance(options, SolveOptions):
            raise TypeError(f"options must be an av.SolveOptions, got {type(options).__name__}")
        return (options or cls()).replace(**changes)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(SolveOptions))


def with_option_signature(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Show `SolveOptions`' fields as `fn`'s keywords (for help() and Jupyter's tooltips), where `fn` takes
    `options=None, **keywords`."""
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(SolveOptions) if f.name not in signature.parameters]
    fn.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return fn


def unused_options(options: SolveOptions, fields: Sequence[str], what: str) -> None:
    """Refuse options an entry point would silently ignore (a baseline sets its own pins, for one)."""
    default = SolveOptions()
    given = [name for name in fields if getattr(options, name) != getattr(default, name)]
    if given:
        raise TypeError(f"the {what} does not take {given}: it sets them itself; leave them out")
