"""`av.editor`: open the notebook plan editor on a training step or on a plan."""

from __future__ import annotations

from typing import Any, Callable

from alpaviz.core import Cluster, OpGraph, Plan, trace
from alpaviz.widgets._editor import PlanEditor
from alpaviz.widgets._session import EditorSession, WhatIf


def editor(fn_or_plan: Callable[..., Any] | Plan, *args: Any, cluster=None, graph: OpGraph | None = None,
           solver=None, **solve_options: Any) -> PlanEditor:
    """Open the visual plan editor on a training step (solved here) or on an existing plan.

    Example:
        >>> ed = av.editor(train_step, params, batch, cluster=av.Cluster.a100_node(1), num_microbatches=4)
        >>> ed = av.editor(plan, graph=graph)
    """
    step_fn = None
    if isinstance(fn_or_plan, Plan):
        plan = fn_or_plan
        if graph is None:
            if not args:
                raise ValueError("av.editor(plan) needs the graph: pass graph=... or the training step and its "
                                 "arguments, av.editor(plan, train_step, params, batch)")
            step_fn, args = args[0], args[1:]
            graph = trace(step_fn, *args)
    else:
        plan, step_fn = None, fn_or_plan
        graph = graph or trace(fn_or_plan, *args)
    whatif = None
    if plan is None:
        whatif = WhatIf(solve_options.pop("num_microbatches", 4), solve_options.pop("schedule", "1f1b"),
                        cluster or Cluster.a100_node(1))
    session = EditorSession(graph, plan, whatif=whatif, solver=solver, solve_options=solve_options,
                            step_fn=step_fn, example_args=args)
    return PlanEditor(session)
