"""How many microbatches a step is split into, searched over the divisors of the global batch.

More microbatches shrink the pipeline bubble (`(B - 1) * max(t_i)` grows
slower than `B * sum(t_i) / n` falls) and the activations each keeps, but
each runs a smaller, less efficient microbatch and pays the per-microbatch
transfers.  The planner and the grid baseline both try every count that
divides the global batch and keep the fastest plan that fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

import jax
import numpy as np

from alpaviz.core.graph import OpGraph, microbatch_args, trace
from alpaviz.core.inter_op._infeasible import ModelTooLargeError
from alpaviz.core.inter_op._options import SolveOptions
from alpaviz.core.inter_op._profile_workers import ProfileWorkers
from alpaviz.core.inter_op._progress import Progress, ProgressFn
from alpaviz.core.inter_op._stage_dp import NoStagePlanError
from alpaviz.core.inter_op._profile_cache import StageProfileCache
from alpaviz.core.plan import InfeasiblePinsError, Plan

# Beyond this a microbatch is too small to keep a device busy on any model we plan.
MAX_MICROBATCHES = 1024


def global_batch_size(args: Sequence[Any], global_batch_argnums: Sequence[int]) -> int:
    """The global batch: the leading dim every leaf of the batch arguments shares."""
    if not global_batch_argnums:
        raise ValueError(
            "searching the number of microbatches needs the global batch: pass global_batch_argnums "
            "(e.g. (1,) when the batch is the step's second argument) with the batch at its global size, "
            "or give num_microbatches as an int"
        )
    sizes = []
    for i in global_batch_argnums:
        if not 0 <= i < len(args):
            raise ValueError(f"global_batch_argnums {tuple(global_batch_argnums)} names argument {i}, "
                             f"but the step takes {len(args)}")
        sizes += [np.shape(leaf)[0] for leaf in jax.tree.leaves(args[i]) if np.shape(leaf)]
    if not sizes:
        raise ValueError(f"the batch arguments {tuple(global_batch_argnums)} hold no array with a batch dim")
    return math.gcd(*sizes)


def microbatch_counts(global_batch: int, limit: int = MAX_MICROBATCHES) -> tuple[int, ...]:
    """Every count that splits `global_batch` into equal microbatches, up to `limit`."""
    return tuple(b for b in range(1, min(global_batch, limit) + 1) if global_batch % b == 0)


# What makes one count unusable without making the search fail: the others may fit.
_UNUSABLE = (ModelTooLargeError, NoStagePlanError, InfeasiblePinsError)


def best_over_microbatches(plan_for: Callable[[int], Plan], counts: Sequence[int], what: str = "plan",
                           progress: bool | ProgressFn = False) -> Plan:
    """The fastest of `plan_for(b)` over `counts`; the plan's notes list every count's step time.

    Raises the last count's error when none fits.
    """
    results: list[tuple[int, Plan | Exception]] = []
    bar = Progress(progress, "microbatch counts")
    try:
        for done, b in enumerate(counts, start=1):
            try:
                results.append((b, plan_for(b)))
            except _UNUSABLE as err:
                results.append((b, err))
            bar.tick(done, len(counts))
    finally:
        bar.close()
    plans = [(b, p) for b, p in results if isinstance(p, Plan)]
    if not plans:
        raise results[-1][1]  # type: ignore[misc]
    best_count, best = min(plans, key=lambda item: item[1].predicted.step_time_s)
    table = ", ".join(
        f"{b}: {p.predicted.step_time_s * 1e3:.4g} ms" if isinstance(p, Plan) else f"{b}: {_short(p)}"
        for b, p in results
    )
    note = f"microbatch counts searched for the {what} (step time each): {table}; chose {best_count}"
    solver = best.solver
    seconds = sum(p.solver.seconds for _, p in plans)
    return dataclasses.replace(best, solver=dataclasses.replace(solver, seconds=seconds, notes=(*solver.notes, note)))


def _short(err: Exception) -> str:
    if isinstance(err, ModelTooLargeError):
        return "does not fit"
    return type(err).__name__


def search_counts(plan_for: Callable[[SolveOptions, OpGraph], Plan], fn_or_graph: Any, args: Sequence[Any],
                  options: SolveOptions, what: str) -> Plan:
    """`num_microbatches="auto"`: the fastest of `plan_for(options at count b, the step traced at b's
    microbatch)` over every count that divides the global batch, all counts sharing one profile cache and
    one pool of profiling processes (a callback progress sees every count's phases).

    The next count's step is traced on a thread while this count is planned: tracing holds one core for
    seconds at GPT-15B, while the profiling processes wait on its result otherwise.
    """
    if isinstance(fn_or_graph, OpGraph):
        raise ValueError(f"the {what} with num_microbatches='auto' needs the step function and its global-batch "
                         f"arguments (with global_batch_argnums), not an OpGraph")
    counts = microbatch_counts(global_batch_size(args, options.global_batch_argnums))
    with contextlib.ExitStack() as owned:
        workers = options.workers
        if isinstance(workers, int) and workers > 1:
            workers = owned.enter_context(ProfileWorkers(workers))  # started once, not once per count
        per_count = options.replace(cache=StageProfileCache() if options.cache is None else options.cache,
                                    progress=options.progress if callable(options.progress) else False,
                                    workers=workers)
        traced = _TracedAhead(fn_or_graph, args, options.global_batch_argnums, counts)
        owned.callback(traced.close)
        at_count = per_count.replace(global_batch_argnums=())  # plan_for gets the graph already cut and traced
        return best_over_microbatches(lambda b: plan_for(at_count.replace(num_microbatches=b), traced.graph(b)),
                                      counts, what, options.progress)


class _TracedAhead:
    """The step traced at each count's microbatch, one count ahead of the one asked for, on one thread."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], argnums: Sequence[int],
                 counts: Sequence[int]) -> None:
        self._fn, self._args, self._argnums, self._counts = fn, tuple(args), tuple(argnums), tuple(counts)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="alpaviz-trace")
        self._futures: dict[int, Future] = {}

    def graph(self, count: int) -> OpGraph:
        self._start(count)
        following = self._counts.index(count) + 1
        if following < len(self._counts):
            self._start(self._counts[following])
        return self._futures.pop(count).result()  # a tracing error is raised here, for this count

    def _start(self, count: int) -> None:
        if count not in self._futures:
            self._futures[count] = self._thread.submit(trace, self._fn,
                                                       *microbatch_args(self._args, self._argnums, count))

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._thread.shutdown(wait=True)


def args_at_microbatch_size(fn_or_graph: Any, args: tuple, options: SolveOptions) -> tuple:
    """The step's arguments with the global-batch ones (`global_batch_argnums`) cut to one microbatch."""
    if not options.global_batch_argnums:
        return args
    if isinstance(fn_or_graph, OpGraph):
        raise ValueError(
            "global_batch_argnums needs the step function and its arguments, not an OpGraph: "
            "pass solve(train_step, params, batch, ...) or trace the step at microbatch size yourself"
        )
    return microbatch_args(args, options.global_batch_argnums, options.num_microbatches)
