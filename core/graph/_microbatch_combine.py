"""How a step's microbatch results combine into `jax.jit`'s numbers, derived from its dataflow.

The step is traced twice, at the global batch and at one microbatch.  A
tensor whose shape differs between the two carries the batch (it *grows*).
Read that way, a training step is:

* per-example work (growing tensors), which a microbatch computes exactly
  as `jax.jit` does, provided every value it reads that stands for the whole
  batch has its global value: constants that scale with the batch (a mean's
  `1/N`), sums over the batch of the batch alone (`sum(mask)`: computed
  once per step at the global batch, *whole*), and random draws of the batch's
  shape (drawn once per step at the global batch and split like the batch);
* sums over the batch of per-example work that depends on the parameters
  (a loss numerator, a correct-prediction count, each weight gradient):
  *partial sums*, which add up over microbatches to the global sum;
* a tail of scalar work on those sums (`sum(ce * mask) / sum(mask)`,
  `exp(loss)`, a weight-decay term added to the loss) that runs once per step
  on the summed partials.

A microbatch's backward is then seeded exactly as the global batch's (its
cotangents read only whole values and constants), so summing its gradients
gives `jax.jit`'s.  What cannot be kept exact is refused, naming the
operator and the user's line: a batch statistic that depends on the
parameters and flows back into per-example work (BatchNorm), a tensor that
pairs examples with each other (a batch x batch similarity), a reduction over
the batch other than a sum, and a gradient that needs a sum over the whole
batch before any microbatch's backward (a loss nonlinear in such a sum).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from alpaviz.core.graph._op_graph import OpGraph, OpNode
from alpaviz.core.graph._scope import user_scope
from alpaviz.core.graph._step_structure import StepStructureError, tensors_depending_on

# Primitives whose values differ by position along the batch: a microbatch-sized call would draw other values.
DRAWS = frozenset({"random_bits", "random_split", "rng_bit_generator", "rng_uniform", "threefry2x32", "iota"})
# Reductions over the batch whose per-microbatch results add up to the global one.
SUMS = frozenset({"reduce_sum", "dot_general", "conv_general_dilated", "scatter-add", "scatter_add"})
# Linear in their first operand, the others being indices or shapes.
_LINEAR_FIRST = frozenset({
    "neg", "convert_element_type", "reshape", "transpose", "squeeze", "expand_dims", "broadcast_in_dim",
    "reduce_sum", "copy", "copy_p", "reduce_precision", "slice", "dynamic_slice", "rev", "real", "imag",
    "conj", "cumsum", "gather",
})
# Linear when every operand is a partial sum (or a constant zero).
_LINEAR_ALL = frozenset({"add", "sub", "add_any", "concatenate"})
# Linear in exactly one partial operand, scaled by the others.
_SCALING = frozenset({"mul", "dot_general", "conv_general_dilated"})


@dataclasses.dataclass(frozen=True)
class PartialSums:
    """The per-microbatch partial sums over the batch, for a runtime that defers their reduction.

    `reductions` are the operators that sum over the batch (a weight
    gradient's `dot_general`, a bias gradient's `reduce_sum`); `tensors` are
    their results and the linear work on them that still runs per microbatch.
    `batch_dims` gives, for each batch-carrying operand of a reduction, the
    dimension the batch runs along.  Any split of that dimension into parts
    gives partial sums that add up to the whole, which is what lets each device
    keep its own part until the update (`alpaviz.core.runtime`).
    """

    tensors: frozenset[str] = frozenset()
    reductions: frozenset[str] = frozenset()
    batch_dims: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class MicrobatchCombination:
    """What the runtime must do so that microbatches give `jax.jit`'s numbers.

    `drawn` tensors are made once per step at the global batch and split
    like the batch; `whole` ones are made once per step at the global batch
    and read whole by every microbatch; `constants` replace the microbatch
    trace's constants that scale with the batch; `per_step` forward operators
    run once per step on the summed partials (see the module docstring).
    """

    drawn: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    constants: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    per_step: frozenset[str] = frozenset()
    partial: PartialSums = PartialSums()


def combine_microbatches(full: OpGraph, micro: OpGraph, batch_inputs: Sequence[str], m: int) -> MicrobatchCombination:
    """Derive how `micro`'s results (the step at 1/m of `full`'s batch) combine exactly; raise where they cannot.

    Example:
        >>> how = combine_microbatches(full, micro, micro.batch_inputs, 4)
    """
    if m == 1 or full is micro:
        return MicrobatchCombination()
    _check_same_operators(full, micro, m)
    grown = _grown_tensors(full, micro, m)
    drawn = _draws(micro, batch_inputs, grown)
    key_inputs = {t for t in micro.inputs if _is_key(micro, t)}
    state = [t for t in micro.inputs if t not in set(batch_inputs) and t not in key_inputs]
    batch_dep = tensors_depending_on(micro.nodes, (*batch_inputs, *drawn))
    state_dep = tensors_depending_on(micro.nodes, state)

    whole: list[str] = []
    partial: dict[str, OpNode] = {}  # partial sum -> the reduction over the batch it comes from
    for node in micro.nodes:
        if node.role == "update":
            continue
        read = [partial[t] for t in node.inputs if t in partial]
        if read:
            if any(t in grown for t in node.outputs):
                raise _feeds_back(node, read[0], m) if node.role == "forward" else _nonlinear(node, read[0])
            partial.update((t, read[0]) for t in node.outputs if t not in grown)
            continue
        reduced = [t for t in node.outputs if t not in grown and t in batch_dep]
        if not reduced or not any(t in grown and t in batch_dep for t in node.inputs):
            continue
        if not any(t in state_dep for t in reduced):
            whole.extend(reduced)
        elif node.primitive in SUMS:
            partial.update((t, node) for t in reduced)
        else:
            raise _not_a_sum(node, m)
    per_step = _tail(micro, partial, grown)
    _check_linear(micro, partial, per_step)
    return MicrobatchCombination(
        drawn=tuple(drawn), whole=tuple(whole), constants=_scaled_constants(full, micro), per_step=per_step,
        partial=_partial_sums(full, micro, partial, per_step, grown),
    )


def _partial_sums(full: OpGraph, micro: OpGraph, partial: Mapping[str, OpNode], per_step: frozenset[str],
                  grown: frozenset[str]) -> PartialSums:
    producer = {t: n for n in micro.nodes for t in n.outputs}
    tensors = frozenset(t for t in partial if producer[t].name not in per_step)
    roots = frozenset(partial[t].name for t in tensors)
    operands = {t for name in roots for t in micro.node(name).inputs if t in grown}
    operands |= {t for t in micro.inputs if t in grown}
    dims = tuple(sorted((t, _grown_dim(full, micro, t)) for t in operands))
    return PartialSums(tensors=tensors, reductions=roots, batch_dims=dims)


def _grown_dim(full: OpGraph, micro: OpGraph, tensor: str) -> int:
    big, small = full.tensor(tensor).shape, micro.tensor(tensor).shape
    return next(i for i, (a, b) in enumerate(zip(big, small)) if a != b)


def _check_same_operators(full: OpGraph, micro: OpGraph, m: int) -> None:
    differ = [(a, b) for a, b in zip(full.nodes, micro.nodes)
              if (a.primitive, a.inputs, a.outputs) != (b.primitive, b.inputs, b.outputs)]
    if not differ and len(full.nodes) == len(micro.nodes):
        return
    a, b = differ[0] if differ else ((full.nodes + micro.nodes)[min(len(full.nodes), len(micro.nodes))],) * 2
    raise StepStructureError(
        f"{full.name!r} traces to different operators at the global batch and at a microbatch of 1/{m} of it "
        f"(first at {a.primitive} {a.name} against {b.primitive}, {_where(b)}), so how microbatch results "
        f"combine cannot be read from its dataflow; use a batch whose microbatch keeps the same operators "
        f"(no dimension of size 1), plan with num_microbatches=1, or pass loss_reduction='mean' or 'sum' to "
        f"combine each microbatch's own results"
    )


def _grown_tensors(full: OpGraph, micro: OpGraph, m: int) -> frozenset[str]:
    """Tensors that carry the batch; each must grow by m along one dimension, else it pairs examples."""
    grown = set()
    for info in micro.tensors:
        big = full.tensor(info.name).shape
        if big == info.shape:
            continue
        dims = [i for i, (a, b) in enumerate(zip(big, info.shape)) if a != b]
        if len(big) != len(info.shape) or len(dims) != 1 or big[dims[0]] != m * info.shape[dims[0]]:
            node = micro.node(info.producer) if info.producer else None
            raise StepStructureError(
                f"tensor {info.name} ({_where(node) if node else 'an input'}) has shape {list(big)} for the "
                f"global batch but {list(info.shape)} for a microbatch of 1/{m}: it pairs examples with each "
                f"other (e.g. a batch x batch similarity, as in a contrastive loss), which splitting the batch "
                f"changes; plan with num_microbatches=1 (data parallelism still splits the batch over devices)"
            )
        grown.add(info.name)
    return frozenset(grown)


def batch_shaped_draws(full: OpGraph, micro: OpGraph, batch_inputs: Sequence[str]) -> tuple[str, ...]:
    """The random draws (and batch positions) a microbatch must take from the global batch's draw."""
    if full is micro:
        return ()
    grown = frozenset(t.name for t in micro.tensors
                      if t.name in full.tensor_by_name and full.tensor(t.name).shape != t.shape)
    return tuple(_draws(micro, batch_inputs, grown))


def _draws(micro: OpGraph, batch_inputs: Sequence[str], grown: frozenset[str]) -> list[str]:
    """The first batch-shaped values made without reading the batch by position-dependent primitives.

    Random bits from a key (passed in or made inside the step), and positions
    counted along the batch (which legacy uint32 keys draw from).  A value
    broadcast to every row needs no such care.
    """
    depends = tensors_depending_on(micro.nodes, batch_inputs)
    scaled: set[str] = set()
    out = []
    for node in micro.nodes:
        if any(t in depends for t in node.inputs):
            continue
        grows = [t for t in node.outputs if t in grown]
        if grows and node.primitive in DRAWS and not any(t in scaled for t in node.inputs):
            out.extend(grows)
        scaled.update(grows)
    return out


def _is_key(graph: OpGraph, name: str) -> bool:
    """A PRNG key input (typed, or a legacy uint32[2]): a draw from it is not parameter work."""
    info = graph.tensor(name)
    return info.dtype.startswith("key<") or (info.shape == (2,) and info.dtype == "uint32")


def _tail(micro: OpGraph, partial: Mapping[str, OpNode], grown: frozenset[str]) -> frozenset[str]:
    """Forward operators on partial sums whose results only the step's outputs or the update read."""
    candidates = {
        n.name for n in micro.nodes
        if n.role == "forward" and any(t in partial for t in n.inputs) and not any(t in grown for t in n.outputs)
    }
    tail: set[str] = set()
    for node in reversed(micro.nodes):
        if node.name not in candidates:
            continue
        readers = [micro.node(c) for t in node.outputs for c in micro.consumers.get(t, ())]
        if all(r.name in tail or r.role == "update" for r in readers):
            tail.add(node.name)
    return frozenset(tail)


def _check_linear(micro: OpGraph, partial: Mapping[str, OpNode], per_step: frozenset[str]) -> None:
    """Per-microbatch work on partial sums must be linear in them, so that summing over microbatches commutes."""
    constants = micro.constants or {}
    for node in micro.nodes:
        if node.role == "update" or node.name in per_step:
            continue
        read = [i for i, t in enumerate(node.inputs) if t in partial]
        if not read or all(micro.tensor(t).dtype.startswith("key<") for t in node.outputs):
            continue
        others = [t for i, t in enumerate(node.inputs) if i not in read]
        zero = all(t in constants and not np.any(constants[t]) for t in others)
        p = node.primitive
        linear = (
            (p in _LINEAR_FIRST and read == [0])
            or (p in _LINEAR_ALL and (not others or zero))
            or (p in _SCALING and len(read) == 1)
            or (p == "div" and read == [0])
            or (p == "select_n" and 0 not in read and (len(read) == len(node.inputs) - 1 or zero))
            or (p in ("scatter-add", "scatter_add") and 1 not in read)
        )
        if not linear:
            raise _nonlinear(node, partial[node.inputs[read[0]]])


def _scaled_constants(full: OpGraph, micro: OpGraph) -> dict[str, Any]:
    """The microbatch trace's constants that differ from the global trace's (they scale with the batch)."""
    big, small = full.constants or {}, micro.constants or {}
    out = {}
    for name, value in small.items():
        other = big.get(name)
        if other is not None and np.shape(other) == np.shape(value) and not np.array_equal(other, value):
            out[name] = other
    return out


# ---- refusals ----------------------------------------------------------------------------------


def _where(node: OpNode) -> str:
    """The module path and the line, or for a plain function its name and line."""
    scope, line = user_scope(node), node.source or "unknown line"
    from_source = scope == user_scope(dataclasses.replace(node, scope=""))
    return line if from_source or not scope else f"{scope}, {line}"


def _feeds_back(node: OpNode, reduction: OpNode, m: int) -> StepStructureError:
    return StepStructureError(
        f"a statistic over the batch that depends on the parameters ({reduction.primitive} {reduction.name} at "
        f"{_where(reduction)}) flows back into per-example work ({node.primitive} {node.name} at {_where(node)}), "
        f"as BatchNorm's mean and variance do: split into {m} microbatches, each would be normalised by its own "
        f"statistics and the step would differ from jax.jit. Plan with num_microbatches=1 (data parallelism "
        f"keeps the statistics exact: XLA reduces them across devices), or accept per-microbatch statistics "
        f"(ghost batch norm), which the plan then records: plan.with_batch_statistics('per_microbatch'), or "
        f"Schedule(..., batch_statistics='per_microbatch') for a manual plan"
    )


def _not_a_sum(node: OpNode, m: int) -> StepStructureError:
    return StepStructureError(
        f"{node.primitive} {node.name} at {_where(node)} reduces over the batch a value that depends on the "
        f"parameters, and only sums combine exactly over {m} microbatches; compute it as a sum (or a mean), "
        f"return it per example (leading dim = batch), or plan with num_microbatches=1"
    )


def _nonlinear(node: OpNode, reduction: OpNode) -> StepStructureError:
    if node.role == "backward":
        what = (f"the gradient needs the sum over the whole batch made by {reduction.primitive} {reduction.name} "
                f"at {_where(reduction)} before any microbatch's backward can run ({node.primitive} {node.name} "
                f"at {_where(node)} reads it): the loss is not linear in that sum (e.g. it divides by a "
                f"parameter-dependent count, or adds a batch-independent term inside the backward)")
    else:
        what = (f"{node.primitive} {node.name} at {_where(node)} is not linear in the sum over the batch made by "
                f"{reduction.primitive} {reduction.name} at {_where(reduction)}, and per-microbatch work reads "
                f"its result")
    return StepStructureError(
        f"{what}, so microbatches cannot reproduce jax.jit's numbers; make the loss a sum or mean over examples "
        f"(divided by values of the batch alone, such as a token count), or plan with num_microbatches=1"
    )
