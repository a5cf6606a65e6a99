"""The editor's state machine, shared by the ipywidgets editor and the panel app.

A session holds the graph, the shown plan, the pins being edited, the
previous plan (for the change in cost) and the what-if options.  Every
action returns a short message for the UI; a failed solve or launch never
replaces the shown plan.  The solver, timeline and runtime are core's
public functions; a session can be given another solver (tests, what-ifs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, Literal

from alpaviz.core import (
    MAX_DOCUMENT_BYTES, Cluster, CostModel, Link, OpGraph, Pins, Plan, SolveOptions, StageProfileCache, Timeline,
    next_step_args,
    parallelize, predicted_timeline, solve, strategy_names as core_strategy_names, trace, validate_plan,
)
from alpaviz.core.graph import microbatch_args, split_microbatch
from alpaviz.core.plan import SCHEDULE_KINDS
from alpaviz.core.inter_op import data_parallel, megatron_grid
from alpaviz.core.intra_op import enumerate_strategies
from alpaviz.widgets import _edits
from alpaviz.widgets._session_workers import SessionWorkers
from alpaviz.widgets._view_model import SOLVER_CHOICE, format_seconds

SOLVER_CHOICE_LABEL = "(solver's choice: {})"

Solver = Callable[..., Plan]
# The schedule control's choices: every schedule, or "auto" for the solver to choose one.
SCHEDULE_CHOICES: tuple[str, ...] = (*SCHEDULE_KINDS, "auto")
PRESETS: dict[str, Callable[[int], Cluster]] = {
    "a100": lambda hosts: Cluster.a100_node(hosts),
    "v100": lambda hosts: Cluster.v100_node(hosts),
    "h100": lambda hosts: Cluster.h100_node(hosts),
}


def repeat_batch(batch: Any, times: int) -> Any:
    """Every array of `batch` repeated `times` along its leading (batch) dim (abstract arrays grow their shape)."""
    import jax
    import jax.numpy as jnp

    def repeat(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct((x.shape[0] * times, *x.shape[1:]), x.dtype)
        return jnp.concatenate([x] * times, axis=0)

    return batch if times == 1 else jax.tree.map(repeat, batch)


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """The re-planning knobs: microbatches, schedule, cluster preset and link bandwidths."""

    num_microbatches: int = 4
    schedule: Literal["1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "auto"] = "1f1b"
    cluster: Cluster = dataclasses.field(default_factory=lambda: Cluster.a100_node(1))

    def __post_init__(self) -> None:
        if self.num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {self.num_microbatches}")
        if self.schedule not in SCHEDULE_CHOICES:
            raise ValueError(f"schedule must be one of {list(SCHEDULE_CHOICES)}, got {self.schedule!r}")

    def with_preset(self, preset: str, num_hosts: int) -> "WhatIf":
        """The same what-if on `num_hosts` hosts of the named cluster preset."""
        if preset not in PRESETS:
            raise ValueError(f"unknown cluster preset {preset!r}; choose one of {sorted(PRESETS)}")
        return dataclasses.replace(self, cluster=PRESETS[preset](num_hosts))

    def with_hosts(self, num_hosts: int) -> "WhatIf":
        """The same kind of host, `num_hosts` of them."""
        return dataclasses.replace(self, cluster=self.cluster.with_hosts(num_hosts))

    def with_bandwidths(self, intra_gb_s: float, inter_gb_s: float) -> "WhatIf":
        """Link bandwidths in GB/s (latencies kept)."""
        if intra_gb_s <= 0 or inter_gb_s <= 0:
            raise ValueError(f"bandwidths must be positive GB/s, got intra={intra_gb_s}, inter={inter_gb_s}")
        c = self.cluster
        return dataclasses.replace(self, cluster=c.with_links(
            Link(c.intra_host.alpha_s, intra_gb_s * 1e9), Link(c.inter_host.alpha_s, inter_gb_s * 1e9)))


WHATIF_FIELDS = ("microbatches", "schedule", "preset", "hosts", "intra_bw", "inter_bw")


def whatif_from_controls(current: WhatIf, cluster_changed: bool, microbatches: int, schedule: str, preset: str,
                         hosts: int, intra_gb_s: float, inter_gb_s: float) -> tuple[WhatIf, dict[str, str]]:
    """The what-if the controls describe, and what is wrong with each bad field (keyed by `WHATIF_FIELDS`).

    A bad field keeps its current value, so it never blocks the others; a changed preset or host count
    brings its own link figures.
    """
    problems: dict[str, str] = {}
    w = current

    def attempt(field: str, make: Callable[[], WhatIf]) -> None:
        nonlocal w
        try:
            w = make()
        except (TypeError, ValueError) as err:
            problems[field] = str(err)

    attempt("microbatches", lambda: dataclasses.replace(w, num_microbatches=int(microbatches)))
    attempt("schedule", lambda: dataclasses.replace(w, schedule=schedule))
    if cluster_changed:
        attempt("hosts", lambda: w.with_preset(preset, int(hosts)) if preset in PRESETS else w.with_hosts(int(hosts)))
        return w, problems
    inter = w.cluster.inter_host.bandwidth_bytes_per_s / 1e9
    attempt("intra_bw", lambda: w.with_bandwidths(intra_gb_s, inter))
    intra = w.cluster.intra_host.bandwidth_bytes_per_s / 1e9
    attempt("inter_bw", lambda: w.with_bandwidths(intra, inter_gb_s))
    return w, problems


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one action did: ok or not, and the sentence the UI shows."""

    ok: bool
    message: str


class EditorSession:
    """Edits pins through `_edits`, re-solves with the solver, keeps the last good plan.

    `background_workers`: processes that profile a what-if's new meshes, started in the background after
    a solve slower than ~1 s (None: two where two cores are free; 0: none).  `close()` stops them.

    Example:
        >>> s = EditorSession(graph, plan, solver=av.solve)
        >>> s.toggle_cut(4); s.resolve().message
    """

    def __init__(
        self,
        graph: OpGraph,
        plan: Plan | None = None,
        *,
        whatif: WhatIf | None = None,
        solver: Solver | None = None,
        solve_options: SolveOptions | dict[str, Any] | None = None,
        step_fn: Callable[..., Any] | None = None,
        example_args: tuple[Any, ...] = (),
        background_workers: int | None = None,
    ) -> None:
        self.graph = graph
        self.solver = solver or solve
        if not isinstance(solve_options, SolveOptions):
            solve_options = SolveOptions.of(None, **dict(solve_options or {}))
        # One cache for every solve of the session (an empty cache is falsy: test for None).
        self.cache = StageProfileCache() if solve_options.cache is None else solve_options.cache
        self.solve_options = solve_options.replace(cache=self.cache)
        # processes that profile new meshes for what-ifs, started after a slow solve (see _session_workers)
        self.workers = SessionWorkers(background_workers, self.solve_options)
        self.whatif = whatif or (WhatIf(plan.schedule.num_microbatches, plan.schedule.kind, plan.cluster)
                                 if plan else WhatIf())
        self.step_fn, self.example_args = step_fn, example_args
        self.previous: Plan | None = None
        self.measured: Timeline | None = None
        self.measured_prediction: Timeline | None = None  # the plan priced for the devices the launch ran on
        self.comparison: tuple[tuple[str, Plan | str], ...] = ()
        self.message, self.ok = "", True
        self.activity = ""  # what the session is busy with ("" when idle)
        self._listeners: list[Callable[[], None]] = []
        self._activity_listeners: list[Callable[[str], None]] = []
        self._progress_listeners: list[Callable[[str, int, int], None]] = []
        if plan is None:
            outcome = self.resolve(Pins())
            if not outcome.ok:
                raise ValueError(f"could not make the first plan: {outcome.message}")
        else:
            plan.check_graph(graph)
            self.plan = plan
            self.pins = plan.pins
        self.message = self.message or "plan loaded"

    # ---- observers --------------------------------------------------------
    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` after every change to the session, so a front end redraws."""
        self._listeners.append(callback)

    def on_activity(self, callback: Callable[[str], None]) -> None:
        """`callback(what)` when a long action starts (what it is) and ends ("")."""
        self._activity_listeners.append(callback)

    def on_progress(self, callback: Callable[[str, int, int], None]) -> None:
        """`callback(phase, done, total)` as a long action advances (layers profiled, DP candidates, steps run)."""
        self._progress_listeners.append(callback)

    @property
    def busy(self) -> bool:
        """True while a solve, what-if or launch is running."""
        return bool(self.activity)

    @contextlib.contextmanager
    def _working(self, what: str):
        self.activity = what
        for callback in self._activity_listeners:
            callback(what)
        try:
            yield
        finally:
            self.activity = ""
            for callback in self._activity_listeners:
                callback("")

    def _report(self, phase: str, done: int, total: int) -> None:
        for callback in self._progress_listeners:
            callback(phase, done, total)

    def _changed(self, outcome: Outcome) -> Outcome:
        self.message, self.ok = outcome.message, outcome.ok
        for callback in self._listeners:
            callback()
        return outcome

    # ---- pin edits ----------------------------------------------------------
    def _edit(self, make: Callable[[], Pins], what: str) -> Outcome:
        try:
            self.pins = make()
        except ValueError as err:
            return Outcome(False, f"cannot pin {what}: {err}")
        return Outcome(True, f"pinned {what}; press Re-solve to apply")

    def toggle_cut(self, layer: int) -> Outcome:
        """Cycle the pin at the gap before `layer`: free, pinned cut, pinned no-cut."""
        if not 1 <= layer < len(self.plan.layers):
            return self._changed(Outcome(False, f"no gap before layer {layer}: pick 1..{len(self.plan.layers) - 1}"))
        outcome = self._edit(lambda: _edits.cycle_cut(self.pins, layer), f"the gap before layer {layer}")
        if not outcome.ok:
            return self._changed(outcome)
        state = "pinned cut" if layer in self.pins.stage_cuts else "pinned no-cut" if layer in self.pins.forbidden_cuts else "free"
        return self._changed(Outcome(True, f"gap before layer {layer}: {state}; press Re-solve to apply"))

    def pin_submesh(self, stage: int, choice) -> Outcome:
        """Pin stage `stage`'s submesh to `choice`, or unpin it with None."""
        return self._changed(self._edit(lambda: _edits.pin_submesh(self.pins, stage, choice), f"stage {stage}'s submesh"))

    def pin_remat(self, stage: int, remat: bool | None) -> Outcome:
        """Pin stage `stage`'s recomputation on or off, or unpin it with None."""
        return self._changed(self._edit(lambda: _edits.pin_remat(self.pins, stage, remat), f"stage {stage}'s remat"))

    def strategy_options(self, row, strategy_names=None) -> tuple[str, ...]:
        """A `StrategyRow`'s alternatives on its stage's mesh; asked per operator shown, not for all."""
        names = strategy_names or core_strategy_names
        options = list(row.options)
        if names is not None:
            stage = self.plan.stages[row.stage]
            try:
                mesh = self.plan.cluster.logical_mesh(stage.submesh, stage.logical_mesh, stage.device_ids[0])
                options += [n for n in names(self.graph, row.node, mesh) if n not in options]
            except Exception:  # an operator the strategy table does not know: offer what the plan has
                pass
        return tuple(options)

    def strategy_costs(self, row) -> dict[str, tuple[float, float]]:
        """Each strategy of a `StrategyRow`'s operator on its stage's mesh: (compute, communication) seconds per
        microbatch under the plan's cost model (resharding to its neighbours comes on top); {} when unknown."""
        stage = self.plan.stages[row.stage]
        try:
            mesh = self.plan.cluster.logical_mesh(stage.submesh, stage.logical_mesh, stage.device_ids[0])
            found = enumerate_strategies(self.graph, self.graph.node(row.node), mesh, self.plan.cost_model,
                                         self.plan.cluster.device)
        except (KeyError, ValueError):
            return {}
        return {s.name: (s.compute_s, s.communication_s) for s in found}

    def strategy_choices(self, row, strategy_names=None) -> list[tuple[str, str]]:
        """(label, value) pairs for the strategy picker: the solver's choice (naming what it chose), then every
        strategy with its cost, cheapest first."""
        costs = self.strategy_costs(row)
        options = self.strategy_options(row, strategy_names)
        ordered = sorted(options, key=lambda n: sum(costs.get(n, (math.inf, 0.0))))
        labels = [(SOLVER_CHOICE_LABEL.format(row.strategy), SOLVER_CHOICE)]
        for name in ordered:
            if name in costs:
                compute, comm = costs[name]
                labels.append((f"{name}: {format_seconds(compute)} compute + {format_seconds(comm)} comm", name))
            else:
                labels.append((name, name))
        return labels

    def pin_strategy(self, node: str, strategy: str | None) -> Outcome:
        """Pin operator `node`'s sharding strategy, or unpin it with None."""
        return self._changed(self._edit(lambda: _edits.pin_strategy(self.pins, node, strategy), f"{node}'s strategy"))

    def reset_pins(self) -> Outcome:
        """Drop every pin; the next re-solve decides everything again."""
        self.pins = Pins()
        return self._changed(Outcome(True, "all pins removed; press Re-solve to apply"))

    def set_whatif(self, whatif: WhatIf, resolve: bool = True) -> Outcome:
        """Plan for another cluster or options, re-solving at once unless `resolve` is False."""
        self.whatif = whatif
        if not resolve:
            return self._changed(Outcome(True, "options changed"))
        return self._resolve(None, f"planning for {whatif.cluster.name}; this plan stays until the new one is ready")

    # ---- solving ------------------------------------------------------------
    def _show(self, plan: Plan) -> None:
        """Make `plan` the shown one; what was measured or compared belongs to the old plan."""
        self.previous = getattr(self, "plan", None)
        self.plan = plan
        self.measured = self.measured_prediction = None
        self.comparison = ()

    def _kept(self) -> str:
        return " (the previous plan is still shown)" if hasattr(self, "plan") else ""

    def resolve(self, pins: Pins | None = None) -> Outcome:
        """Re-solve keeping the pins; on failure keep the shown plan and explain."""
        return self._resolve(pins, "re-solving")

    def _resolve(self, pins: Pins | None, activity: str) -> Outcome:
        if pins is not None:
            self.pins = pins
        if self.solver is None:
            return self._changed(Outcome(False, "Re-solve not available: this session has no solver (give it solver=av.solve)"))
        options = self.solve_options.replace(num_microbatches=self.whatif.num_microbatches,
                                             schedule=self.whatif.schedule, pins=self.pins, progress=self._report)
        start = time.perf_counter()
        try:
            with self._working(activity):
                plan = self.solver(self.graph, cluster=self.whatif.cluster, options=options)
        except ValueError as err:
            return self._changed(Outcome(False, f"infeasible: {err}{self._kept()}"))
        except Exception as err:  # a solver bug must not take the editor down
            return self._changed(Outcome(False, f"solve failed: {type(err).__name__}: {err}{self._kept()}"))
        self._show(plan)
        seconds = time.perf_counter() - start
        self.solve_options = self.workers.after_solve(seconds, self.solve_options)
        outcome = self._changed(Outcome(True, f"re-solved in {seconds:.2f} s"))
        self.workers.prefetch_neighbours(self.graph, self.whatif.cluster, options)
        return outcome

    def close(self) -> None:
        """Stop the profiling processes the session started (they also stop when it is collected)."""
        self.workers.close()

    def search_microbatches(self) -> Outcome:
        """Re-solve trying every microbatch count that divides the global batch (the example batch times the
        current count), keeping the fastest plan; the session then holds the step traced at that microbatch."""
        if self.step_fn is None or not self.graph.batch_argnums:
            why = ("the training step: open the editor with av.editor(fn, *args)" if self.step_fn is None
                   else f"to know the batch: {self.graph.batch_note}")
            return self._changed(Outcome(False, f"Searching the microbatch count needs {why}"))
        argnums, m = self.graph.batch_argnums, self.whatif.num_microbatches
        global_args = tuple(repeat_batch(a, m) if i in argnums else a for i, a in enumerate(self.example_args))
        options = self.solve_options.replace(num_microbatches="auto", global_batch_argnums=argnums,
                                             schedule=self.whatif.schedule, pins=self.pins, progress=self._report)
        start = time.perf_counter()
        try:
            with self._working("searching the microbatch count"):
                plan = self.solver(self.step_fn, *global_args, cluster=self.whatif.cluster, options=options)
            count = plan.schedule.num_microbatches
            micro_args = microbatch_args(global_args, argnums, count)
            graph = trace(self.step_fn, *micro_args)
            plan.check_graph(graph)
        except ValueError as err:
            return self._changed(Outcome(False, f"no microbatch count works: {err}{self._kept()}"))
        except Exception as err:  # a solver bug must not take the editor down
            return self._changed(Outcome(False, f"search failed: {type(err).__name__}: {err}{self._kept()}"))
        import jax

        cut = lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else split_microbatch(x, count, 0)  # noqa: E731
        self.example_args = tuple(jax.tree.map(cut, a) if i in argnums else a for i, a in enumerate(global_args))
        self.graph = graph
        self.whatif = dataclasses.replace(self.whatif, num_microbatches=count)
        self._show(plan)
        rows = min(x.shape[0] for i in argnums for x in jax.tree.leaves(micro_args[i]) if x.shape)
        return self._changed(Outcome(True, (
            f"searched the microbatch count in {time.perf_counter() - start:.2f} s: {count} microbatches of "
            f"{rows} (global batch {rows * count}); the step times per count are in the plan's notes")))

    def runner_up_stage_counts(self) -> tuple[int, ...]:
        """The stage counts priced beside the plan: one fewer and one more than it has (unless the pins fix it)."""
        if self.pins.num_stages is not None:
            return ()
        most = min(self.graph.num_layers, self.whatif.cluster.num_devices)
        return tuple(n for n in (self.plan.num_stages - 1, self.plan.num_stages + 1) if 1 <= n <= most)

    def compare(self) -> Outcome:
        """Price beside the shown plan the solver's best with one stage fewer and one more (the runner-ups of
        the stage DP, under the same pins), the Megatron grid's best and data parallelism, from the same
        profiles."""
        cluster = self.whatif.cluster
        options = self.solve_options.replace(num_microbatches=self.whatif.num_microbatches,
                                             schedule=self.whatif.schedule, progress=False)
        # The baselines pin their own layout: they take the options without the session's pins and hints.
        baseline = options.replace(pins=Pins(), submeshes=None, tolerance=0.0, previous=None)
        entries: list[tuple[str, Plan | str]] = [("this plan", self.plan)]
        jobs: list[tuple[str, Callable[[], Plan]]] = [
            (f"best with {n} stages", lambda n=n: self.solver(
                self.graph, cluster=cluster, options=options.replace(pins=dataclasses.replace(self.pins, num_stages=n))))
            for n in self.runner_up_stage_counts()
        ]
        jobs += [("Megatron grid (best)", lambda: megatron_grid(self.graph, cluster=cluster, options=baseline)),
                 ("data parallel", lambda: data_parallel(self.graph, cluster=cluster, options=baseline))]
        with self._working("pricing the alternatives"):
            for done, (name, make) in enumerate(jobs):
                self._report("alternatives priced", done, len(jobs))
                try:
                    entries.append((name, make()))
                except ValueError as err:  # does not fit, or no configuration applies: say why
                    entries.append((name, str(err).splitlines()[0][:200]))
        self.comparison = tuple(entries)
        return self._changed(Outcome(True, "compared with the runner-up stage counts, the Megatron grid and "
                                           "data parallelism"))

    # ---- timelines and launch ----------------------------------------------
    def predicted_timeline(self) -> Timeline:
        """The current plan's predicted timeline, as the Timeline tab draws it."""
        return predicted_timeline(self.plan, self.graph)

    def launch(self, steps: int = 3) -> Outcome:
        """Run `av.parallelize` for `steps` steps here and keep the last step's measured timeline."""
        if not isinstance(steps, int) or steps < 1:
            return self._changed(Outcome(False, f"Launch runs at least one step, got steps={steps!r}"))
        if self.step_fn is None:
            return self._changed(Outcome(False, "Launch needs the training step: open the editor with av.editor(fn, *args)"))
        if not self.graph.batch_argnums:
            return self._changed(Outcome(False, f"Launch needs to know the batch: {self.graph.batch_note}"))
        try:
            # The graph was traced at the example batch, which the plan takes as one microbatch:
            # a step runs num_microbatches of them, so the launch repeats the example batch.
            m = self.plan.schedule.num_microbatches
            args = tuple(repeat_batch(a, m) if i in self.graph.batch_argnums else a
                         for i, a in enumerate(self.example_args))
            with self._working("launching"):
                # The last step is timed (the ones before it compile and warm up): its timeline is drawn.
                step = parallelize(self.step_fn, self.plan, example_args=args, batch_argnums=self.graph.batch_argnums,
                                   record_trace=steps)
                for done in range(steps):
                    self._report("steps run", done, steps)
                    args = next_step_args(args, step(*args))
                self._report("steps run", steps, steps)
            self.measured = step.last_trace()
        except Exception as err:  # shown in the UI, the plan stays
            return self._changed(Outcome(False, f"launch failed: {type(err).__name__}: {err}"))
        with self._working("pricing the plan for this machine"):
            self.measured_prediction = self.local_prediction()
        return self._changed(Outcome(True, f"launched {steps} steps; measured timeline filled in"))

    def local_prediction(self) -> Timeline | None:
        """The plan's stage layout priced for this machine's devices as calibrated (`Cluster.local(calibrate=True)`,
        at 100% of the measured rates), so a launch has a prediction on its own hardware to be compared with;
        None when the layout does not fit this machine or cannot be priced there."""
        plan = self.plan
        try:
            cluster = Cluster.local(calibrate=True)
            pins = Pins(stage_cuts=plan.stage_cuts, num_stages=plan.num_stages)
            for stage in plan.stages:
                pins = pins.with_submesh(stage.index, stage.submesh, stage.logical_mesh).with_remat(stage.index,
                                                                                                  stage.remat)
            options = SolveOptions(
                cost_model=CostModel(compute_efficiency=1.0, memory_efficiency=1.0),
                num_microbatches=plan.schedule.num_microbatches, schedule=plan.schedule.kind, pins=pins,
                memory_limit=1e18, progress=False, cache=self.cache,  # it ran: it fits
                stage_cost=self.solve_options.stage_cost, num_layers=self.solve_options.num_layers)
            local = solve(self.graph, cluster=cluster, options=options)
            return predicted_timeline(local, self.graph)
        except ValueError:
            return None

    # ---- files ----------------------------------------------------------------
    def trace_json(self) -> str:
        """The measured timeline (after a launch), else the predicted one, as Chrome / Perfetto trace JSON."""
        return (self.measured or self.predicted_timeline()).to_chrome_trace()

    def save_trace(self, path: str) -> Outcome:
        """Write the timeline (measured if launched, else predicted) as a Chrome trace to `path`."""
        with open(path, "w") as f:
            f.write(self.trace_json())
        which = "measured" if self.measured is not None else "predicted"
        return self._changed(Outcome(True, f"{which} timeline saved to {path}: open it in ui.perfetto.dev"))

    def save(self, path: str) -> Outcome:
        """Write the plan, with the session's pins, as JSON to `path`."""
        with open(path, "w") as f:
            f.write(self.plan.with_pins(self.pins).to_json(indent=1))
        return self._changed(Outcome(True, f"plan saved to {path}"))

    def load_text(self, document: str | bytes) -> Outcome:
        """Show a plan from a JSON document (the web app's upload: bytes only, never a path).

        The document is size- and depth-limited and checked against this
        session's graph and cluster before it replaces the shown plan.
        """
        try:
            plan = Plan.from_json(document)
            validate_plan(plan, self.graph)
        except ValueError as err:
            return self._changed(Outcome(False, f"could not load the plan: {err}"))
        self.pins = plan.pins
        self._show(plan)
        return self._changed(Outcome(True, "plan loaded"))

    def load(self, path: str) -> Outcome:
        """Show a plan from a JSON file on this machine (the notebook editor, in the user's own kernel)."""
        try:
            with open(path, "rb") as f:
                document = f.read(MAX_DOCUMENT_BYTES + 1)
        except OSError as err:
            return self._changed(Outcome(False, f"could not load the plan: {err}"))
        return self.load_text(document)
