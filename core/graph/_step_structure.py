"""Which operators of a training step run once per microbatch and which once per step, from its dataflow.

A step is a per-microbatch part (forward and backward, run on each
microbatch) and a once-per-step part (the update, run on the accumulated
gradients).  The split is read from the dataflow, not guessed from names:

* backward: every operator JAX's AD put under `transpose(...)` (name stacks
  composed through inlined jit, custom_jvp/vjp and remat calls, so a
  recomputed forward inside `jax.checkpoint` is backward work), and any
  operator downstream of one that still feeds the backward (a cotangent sum
  outside AD's scope);
* update: every other operator downstream of the backward (the optimizer,
  global-norm clipping), and batch-independent operators that only the
  update reads (Adam's `b1 * mu`, a step counter);
* forward: the rest.

The tensors that cross from the per-microbatch part into the update are the
gradients; the update may read nothing else that depends on the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from alpaviz.core.graph._op_graph import OpGraph, Role


class StepStructureError(ValueError):
    """The step cannot be split into per-microbatch and once-per-step parts as written."""


@dataclasses.dataclass(frozen=True)
class RawOp:
    """What role inference needs of one operator: its wiring, composed scope and source line."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scope: str
    source: str = ""
    primitive: str = ""


# Operators that commute with summing over microbatches: applied to the accumulated
# gradients once per step they give the same result as applied to each microbatch's.
SUM_LINEAR = frozenset({
    "add_any", "add", "transpose", "reshape", "convert_element_type", "copy", "squeeze",
    "expand_dims", "neg",
})


def infer_roles(ops: Sequence[RawOp], batch_inputs: Sequence[str]) -> list[Role]:
    """Forward / backward / update for each op (in topological order), checked against the batch.

    Raises StepStructureError when an update operator reads a batch-dependent
    tensor that is not a gradient, naming the operator and its source line.
    """
    producer = {t: i for i, op in enumerate(ops) for t in op.outputs}
    consumers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for t in dict.fromkeys(op.inputs):
            consumers.setdefault(t, []).append(i)
    transposed = [_in_transpose(op.scope) for op in ops]
    if not any(transposed):
        return ["forward"] * len(ops)

    after_grad = [False] * len(ops)
    for i, op in enumerate(ops):
        after_grad[i] = transposed[i] or any(
            after_grad[producer[t]] for t in op.inputs if t in producer
        )
    feeds_backward = [False] * len(ops)
    for i in reversed(range(len(ops))):
        feeds_backward[i] = any(
            transposed[c] or feeds_backward[c] for t in ops[i].outputs for c in consumers.get(t, ())
        )
    dependent = tensors_depending_on(ops, batch_inputs)
    batch_dep = [any(t in dependent for t in op.outputs) for op in ops]

    roles: list[Role] = []
    for i in range(len(ops)):
        if transposed[i] or (after_grad[i] and feeds_backward[i]):
            roles.append("backward")
        elif after_grad[i]:
            roles.append("update")
        else:
            roles.append("forward")
    # Batch-independent work that only the update reads (or nothing reads: a new step counter,
    # an unused cast) runs once per step with it.
    for i in reversed(range(len(ops))):
        if roles[i] != "forward" or batch_dep[i] or feeds_backward[i]:
            continue
        if all(roles[c] == "update" for t in ops[i].outputs for c in consumers.get(t, ())):
            roles[i] = "update"
    _defer_linear_gradient_sums(ops, roles, producer, consumers, batch_dep, set(batch_inputs))
    _check_update_reads(ops, roles, producer, batch_dep, set(batch_inputs))
    return roles


def _defer_linear_gradient_sums(ops, roles, producer, consumers, batch_dep, batch) -> None:
    """Move linear backward work that only the update reads (a tied weight's two cotangents summed,
    a gradient cast or reshaped) into the update.

    It then runs once per step on the accumulated gradients instead of on every
    microbatch, so a tied embedding's cotangent crosses the pipeline once per step.
    """
    for i in reversed(range(len(ops))):
        op = ops[i]
        if roles[i] != "backward" or op.primitive not in SUM_LINEAR:
            continue
        readers = [c for t in op.outputs for c in consumers.get(t, ())]
        if not readers or any(roles[c] != "update" for c in readers):
            continue
        if all(_gradient_or_step_constant(t, producer, roles, batch_dep, batch) for t in op.inputs):
            roles[i] = "update"


def _gradient_or_step_constant(tensor, producer, roles, batch_dep, batch) -> bool:
    """A backward value, or one that is the same for every microbatch."""
    p = producer.get(tensor)
    if p is None:
        return tensor not in batch
    return roles[p] == "backward" or not batch_dep[p]


def gradient_producers(graph: OpGraph, nodes: Iterable[str] | None = None) -> frozenset[str]:
    """Backward operators (of `nodes`, default all) whose results only the update reads (or the step
    returns): the gradients.

    Their results are summed over the step's microbatches before anything
    reads them, so a reduction across devices they need (a data-parallel
    gradient's all-reduce) can wait and run once per step on the sum.
    """
    outputs = set(graph.outputs)
    found = []
    for node in graph.nodes if nodes is None else map(graph.node, nodes):
        if node.role != "backward":
            continue
        readers = [graph.node(c) for t in node.outputs for c in graph.consumers.get(t, ())]
        if all(r.role == "update" for r in readers) and (readers or any(t in outputs for t in node.outputs)):
            found.append(node.name)
    return frozenset(found)


def _in_transpose(scope: str) -> bool:
    return "transpose(" in scope


def tensors_depending_on(ops: Iterable[Any], seeds: Iterable[str]) -> set[str]:
    """`seeds` and every tensor computed from them, over ops in topological order (OpNodes or RawOps)."""
    dependent = set(seeds)
    for op in ops:
        if any(t in dependent for t in op.inputs):
            dependent.update(op.outputs)
    return dependent


def _check_update_reads(ops, roles, producer, batch_dep, batch) -> None:
    for i, op in enumerate(ops):
        if roles[i] != "update":
            continue
        for t in op.inputs:
            p = producer.get(t)
            if t in batch:
                culprit = f"the batch input {t!r}"
            elif p is not None and roles[p] == "forward" and batch_dep[p]:
                culprit = f"{t!r}, a forward value made by {ops[p].name} ({ops[p].source or 'unknown source'})"
            else:
                continue
            raise StepStructureError(
                f"operator {op.name} ({op.source or 'unknown source'}) runs once per step, after the gradients, "
                f"but reads {culprit}, which changes with every microbatch; only gradients may cross from the "
                f"forward/backward pass into the update. Compute that value inside the loss (e.g. return it as "
                f"an auxiliary output) or plan with num_microbatches=1"
            )


# ---- which arguments are the batch ---------------------------------------------------------


def is_key_leaf(x: Any) -> bool:
    """A PRNG key: a typed key array, or a legacy raw uint32[2] key."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return True
    return np.shape(x) == (2,) and dtype == np.uint32


def find_batch_argnums(args: Sequence[Any], out_shape: Any) -> tuple[tuple[int, ...], str]:
    """The batch arguments of `step(*args)`, and how they were told apart.

    State arguments (params, optimizer state, a PRNG key) come back updated:
    the step returns a value of the same structure, shapes and dtypes.  Of
    the others, the batch is the argument (or arguments) whose array leaves
    all share one leading dimension.  Raises when that leaves no answer or
    several that disagree.
    """
    returned = [_signature(o) for o in _top_level(out_shape)]
    candidates = []
    for i, arg in enumerate(args):
        leaves = [x for x in jax.tree.leaves(arg) if not is_key_leaf(x)]
        if not leaves or _signature(arg) in returned:
            continue
        leading = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
        if len(leading) == 1 and None not in leading:
            candidates.append((i, leading.pop()))
    sizes = {size for _, size in candidates}
    if candidates and len(sizes) == 1:
        nums = tuple(i for i, _ in candidates)
        return nums, (f"argument(s) {list(nums)} are the batch: they are not returned updated (as params and "
                      f"optimizer state are) and their leaves share leading dim {sizes.pop()}")
    found = ", ".join(f"argument {i} (leading dim {s})" for i, s in candidates) or "none"
    raise StepStructureError(
        f"cannot tell which arguments of the step are the batch (candidates: {found}); pass batch_argnums=(k,) "
        f"naming the arguments split into microbatches along dim 0"
    )


def next_step_args(args: Sequence[Any], outputs: Any) -> tuple[Any, ...]:
    """The arguments of the next step: each argument the step returned updated is replaced by its update.

    Example:
        >>> args = next_step_args((params, opt_state, batch), step(params, opt_state, batch))
    """
    returned = {}
    for out in _top_level(outputs):
        returned.setdefault(_signature(out), out)
    return tuple(returned.get(_signature(arg), arg) for arg in args)


def _top_level(tree: Any) -> list[Any]:
    return list(tree) if isinstance(tree, (tuple, list)) else [tree]


def _signature(tree: Any) -> tuple:
    """Structure and leaf shapes and dtypes; a Python scalar counts as the 0-d array JAX makes of it (a Flax
    `TrainState.create` holds `step=0`, the step returns an int32 array)."""
    leaves, treedef = jax.tree.flatten(tree)
    return (treedef, tuple(_leaf_signature(x) for x in leaves))


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, (bool, int, float, complex)) or hasattr(x, "dtype"):
        dtype = getattr(x, "dtype", None)
        return tuple(np.shape(x)), str(dtype if dtype is not None else jax.numpy.result_type(x))
    return (), type(x).__name__


def state_inputs(graph: OpGraph) -> frozenset[str]:
    """Step inputs an update reads: parameters and optimizer state (what a step replaces)."""
    return frozenset(
        t for t in graph.inputs
        if any(graph.node(c).role == "update" for c in graph.consumers.get(t, ()))
    )
