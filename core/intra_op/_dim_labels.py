"""How each primitive's dims may be split: einsum-style labels per operand and result dim.

Dims that share a label are split over the same mesh axes.  A label found
in an operand but in no result is summed away, so splitting it leaves
partial sums that need an all-reduce.  `None` marks a dim that must stay
whole (a concatenated, sliced or gathered dim); an operand of `None` takes
any sharding at no cost (a constant or a scalar).  A primitive without a
rule here gets only the replicated strategy, which is always correct.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

from alpaviz.core.graph import OpNode, TensorInfo

Label = Optional[str]
Labels = tuple[Label, ...]

ELEMENTWISE = frozenset(
    """
    add sub mul div rem max min pow integer_pow neg abs sign exp exp2 log log1p expm1
    tanh logistic sin cos tan sqrt rsqrt cbrt erf erfc erf_inv square reciprocal
    select_n clamp gt ge lt le eq ne and or not xor atan2 floor ceil round is_finite
    nextafter add_any convert_element_type stop_gradient copy copy_p reduce_precision
    real imag conj shift_left shift_right_logical shift_right_arithmetic population_count
    """.split()
)
SUM_REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or".split())
INDEX_REDUCTIONS = frozenset(("argmax", "argmin"))
SCANS = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())
# Primitives that pass each operand through unchanged (one result per operand).
IDENTITY = frozenset(("layer_boundary", "optimization_barrier"))


@dataclasses.dataclass(frozen=True)
class DimLabels:
    """Labels of one operator's dims; `sizes` gives the size a split must divide."""

    inputs: tuple[Labels | None, ...]
    outputs: tuple[Labels, ...]
    sizes: tuple[tuple[str, int], ...]
    reduce_scatter: bool = False

    @property
    def reduced(self) -> frozenset[str]:
        """Labels summed away: split, they leave partial sums."""
        ins = {lab for labs in self.inputs if labs for lab in labs if lab}
        outs = {lab for labs in self.outputs for lab in labs if lab}
        return frozenset(ins - outs)


def is_free(tensor: TensorInfo) -> bool:
    """Constants and scalars are available in any sharding at no cost."""
    return tensor.kind == "constant" or not tensor.shape


def dim_labels(node: OpNode, ins: Sequence[TensorInfo], outs: Sequence[TensorInfo]) -> DimLabels | None:
    """The label rule for `node`, or None when only replication is supported.

    From the operands' records: the rules read shapes, dtypes and params, never names.
    """
    rule = _RULES.get(node.primitive)
    if rule is None and node.primitive in ELEMENTWISE:
        rule = _elementwise
    if rule is None:
        return None
    ins, outs = list(ins), list(outs)
    try:
        return rule(node, ins, outs)
    except (TypeError, ValueError, IndexError, KeyError):
        # An unusual parameter layout: replication is the safe answer.
        return None


def _finish(ins: list[TensorInfo], in_labels: list[Labels | None], outs: list[TensorInfo],
            out_labels: list[Labels], sizes: dict[str, int] | None = None,
            reduce_scatter: bool = False) -> DimLabels:
    """Drop labels on size-1 dims and free operands; collect label sizes."""
    found: dict[str, int] = {}

    def clean(tensor: TensorInfo, labels: Labels) -> Labels:
        out = []
        for lab, size in zip(labels, tensor.shape):
            if lab is None or size <= 1:
                out.append(None)
                continue
            found[lab] = math.gcd(found.get(lab, size), size)
            out.append(lab)
        return tuple(out)

    cleaned_in = tuple(None if labs is None or is_free(t) else clean(t, labs) for t, labs in zip(ins, in_labels))
    cleaned_out = tuple(clean(t, labs) for t, labs in zip(outs, out_labels))
    if sizes:
        for lab, size in sizes.items():
            if lab in found:
                found[lab] = math.gcd(found[lab], size)
    return DimLabels(cleaned_in, cleaned_out, tuple(sorted(found.items())), reduce_scatter)


def _own(shape: tuple[int, ...], prefix: str = "d") -> list[Label]:
    return [f"{prefix}{i}" for i in range(len(shape))]


def _elementwise(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels | None:
    if len(outs) != 1:
        return None
    shape = outs[0].shape
    labels = _own(shape)
    in_labels: list[Labels | None] = []
    for t in ins:
        if is_free(t):
            in_labels.append(None)
        elif len(t.shape) != len(shape):
            return None
        else:
            in_labels.append(tuple(lab if s == o else None for lab, s, o in zip(labels, t.shape, shape)))
    return _finish(ins, in_labels, outs, [tuple(labels)])


def _dot_general(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    (lc, rc), (lb, rb) = node.param("dimension_numbers")
    lhs: list[Label] = [None] * len(ins[0].shape)
    rhs: list[Label] = [None] * len(ins[1].shape)
    out: list[Label] = []
    for i, (a, b) in enumerate(zip(lb, rb)):
        lhs[a] = rhs[b] = f"b{i}"
        out.append(f"b{i}")
    for i, (a, b) in enumerate(zip(lc, rc)):
        lhs[a] = rhs[b] = f"k{i}"
    for d in range(len(lhs)):
        if d not in lc and d not in lb:
            lhs[d] = f"m{d}"
            out.append(f"m{d}")
    for d in range(len(rhs)):
        if d not in rc and d not in rb:
            rhs[d] = f"n{d}"
            out.append(f"n{d}")
    return _finish(ins, [tuple(lhs), tuple(rhs)], outs, [tuple(out)], reduce_scatter=True)


def _conv(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels | None:
    if node.param("feature_group_count", 1) != 1 or node.param("batch_group_count", 1) != 1:
        return None
    lhs_spec, rhs_spec, out_spec = node.param("dimension_numbers")
    lhs: list[Label] = [None] * len(ins[0].shape)
    rhs: list[Label] = [None] * len(ins[1].shape)
    out: list[Label] = [None] * len(outs[0].shape)
    lhs[lhs_spec[0]] = out[out_spec[0]] = "n"
    lhs[lhs_spec[1]] = rhs[rhs_spec[1]] = "c"
    rhs[rhs_spec[0]] = out[out_spec[1]] = "o"
    return _finish(ins, [tuple(lhs), tuple(rhs)], outs, [tuple(out)])


def _reduce(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    axes = set(node.param("axes"))
    labels = _own(ins[0].shape)
    if node.primitive in INDEX_REDUCTIONS:
        labels = [None if d in axes else lab for d, lab in enumerate(labels)]
    out = [lab for d, lab in enumerate(_own(ins[0].shape)) if d not in axes]
    return _finish(ins, [tuple(labels)] + [None] * (len(ins) - 1), outs, [tuple(out)] * len(outs))


def _scan(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    axis = node.param("axis")
    labels = tuple(None if d == axis else lab for d, lab in enumerate(_own(ins[0].shape)))
    return _finish(ins, [labels], outs, [labels])


def _keep_dims(whole: Callable[[OpNode, TensorInfo], set[int]]):
    """Rule for ops whose operands and results share a shape except some whole dims."""

    def rule(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
        first = ins[0]
        fixed = whole(node, first)
        labels = tuple(None if d in fixed else lab for d, lab in enumerate(_own(first.shape)))
        in_labels: list[Labels | None] = []
        for t in ins:
            in_labels.append(labels if len(t.shape) == len(first.shape) else None)
        return _finish(ins, in_labels, outs, [labels] * len(outs))

    return rule


def _changed_dims(node: OpNode, t: TensorInfo, outs_shape: tuple[int, ...]) -> set[int]:
    return {d for d, (a, b) in enumerate(zip(t.shape, outs_shape)) if a != b}


def _slice_like(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    fixed = _changed_dims(node, ins[0], outs[0].shape)
    if node.primitive == "dynamic_update_slice":
        fixed = _changed_dims(node, ins[0], ins[1].shape)
    labels = tuple(None if d in fixed else lab for d, lab in enumerate(_own(ins[0].shape)))
    in_labels: list[Labels | None] = [labels]
    for t in ins[1:]:
        in_labels.append(labels if len(t.shape) == len(labels) else None)
    return _finish(ins, in_labels, outs, [labels])


def _pad(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    config = node.param("padding_config")
    labels = tuple(None if any(config[d]) else lab for d, lab in enumerate(_own(ins[0].shape)))
    return _finish(ins, [labels, None], outs, [labels])


def _broadcast(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    out_shape = outs[0].shape
    out = _own(out_shape)
    dims = node.param("broadcast_dimensions")
    lhs = tuple(out[o] if ins[0].shape[i] == out_shape[o] else None for i, o in enumerate(dims))
    return _finish(ins, [lhs] + [None] * (len(ins) - 1), outs, [tuple(out)])


def _transpose(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    labels = _own(ins[0].shape)
    perm = node.param("permutation")
    return _finish(ins, [tuple(labels)], outs, [tuple(labels[p] for p in perm)])


def _squeeze(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    gone = set(d % len(ins[0].shape) for d in node.param("dimensions"))
    labels = _own(ins[0].shape)
    return _finish(ins, [tuple(labels)], outs, [tuple(lab for d, lab in enumerate(labels) if d not in gone)])


def _reshape(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels | None:
    """Match dims by products; a split or merged group keeps a split on its major dim."""
    a, b = ins[0].shape, outs[0].shape
    a_dims = [d for d, s in enumerate(a) if s > 1]
    b_dims = [d for d, s in enumerate(b) if s > 1]
    in_labels: list[Label] = [None] * len(a)
    out_labels: list[Label] = [None] * len(b)
    sizes: dict[str, int] = {}
    i = j = 0
    while i < len(a_dims) and j < len(b_dims):
        ga, gb = [a_dims[i]], [b_dims[j]]
        pa, pb = a[a_dims[i]], b[b_dims[j]]
        while pa != pb:
            if pa < pb:
                i += 1
                if i >= len(a_dims):
                    return None
                ga.append(a_dims[i])
                pa *= a[a_dims[i]]
            else:
                j += 1
                if j >= len(b_dims):
                    return None
                gb.append(b_dims[j])
                pb *= b[b_dims[j]]
        label = f"g{ga[0]}"
        in_labels[ga[0]] = out_labels[gb[0]] = label
        sizes[label] = math.gcd(a[ga[0]], b[gb[0]])
        i += 1
        j += 1
    return _finish(ins, [tuple(in_labels)] + [None] * (len(ins) - 1), outs, [tuple(out_labels)], sizes)


def _iota(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    return _finish(ins, [None] * len(ins), outs, [tuple(_own(outs[0].shape))])


def _gather(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels | None:
    offset_dims, collapsed, _start_map, operand_batching, _idx_batching = node.param("dimension_numbers")
    if operand_batching:
        return None
    operand, indices = ins[0], ins[1]
    slice_sizes = node.param("slice_sizes")
    out: list[Label] = [None] * len(outs[0].shape)
    op_labels: list[Label] = [None] * len(operand.shape)
    kept = [d for d in range(len(operand.shape)) if d not in collapsed]
    for position, d in zip(offset_dims, kept):
        if slice_sizes[d] == operand.shape[d]:
            op_labels[d] = out[position] = f"o{d}"
    batch_out = [d for d in range(len(out)) if d not in offset_dims]
    idx_labels: list[Label] = [None] * len(indices.shape)
    for k, position in zip(range(len(indices.shape) - 1), batch_out):
        idx_labels[k] = out[position] = f"i{k}"
    return _finish(ins, [tuple(op_labels), tuple(idx_labels)], outs, [tuple(out)])


def _scatter_add(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels | None:
    window, inserted, _to_operand, operand_batching, _idx_batching = node.param("dimension_numbers")
    if operand_batching:
        return None
    operand, indices, updates = ins[0], ins[1], ins[2]
    op_labels: list[Label] = [None] * len(operand.shape)
    upd: list[Label] = [None] * len(updates.shape)
    kept = [d for d in range(len(operand.shape)) if d not in inserted]
    for position, d in zip(window, kept):
        if updates.shape[position] == operand.shape[d]:
            op_labels[d] = upd[position] = f"o{d}"
    scatter_dims = [d for d in range(len(updates.shape)) if d not in window]
    idx_labels: list[Label] = [None] * len(indices.shape)
    for k, position in zip(range(len(indices.shape) - 1), scatter_dims):
        idx_labels[k] = upd[position] = f"i{k}"
    return _finish(ins, [tuple(op_labels), tuple(idx_labels), tuple(upd)], outs, [tuple(op_labels)])


def _stack(node: OpNode, ins: list[TensorInfo], outs: list[TensorInfo]) -> DimLabels:
    """`stack` (a scan's per-iteration outputs): the new axis stays whole, the others split as the parts do."""
    axis = node.param("axis", 0)
    labels = _own(ins[0].shape)
    out = (*labels[:axis], None, *labels[axis:])
    return _finish(ins, [tuple(labels)] * len(ins), outs, [tuple(out)])


_RULES: dict[str, Callable[[OpNode, list[TensorInfo], list[TensorInfo]], DimLabels | None]] = {
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "broadcast_in_dim": _broadcast,
    "transpose": _transpose,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "iota": _iota,
    "gather": _gather,
    "scatter-add": _scatter_add,
    "scatter_add": _scatter_add,
    "slice": _slice_like,
    "dynamic_slice": _slice_like,
    "dynamic_update_slice": _slice_like,
    "pad": _pad,
    "concatenate": _keep_dims(lambda node, t: {node.param("dimension")}),
    "stack": _stack,
    "split": _keep_dims(lambda node, t: {node.param("axis")}),
    "rev": _keep_dims(lambda node, t: set(node.param("dimensions"))),
    "sort": _keep_dims(lambda node, t: {node.param("dimension")}),
    **{p: _reduce for p in SUM_REDUCTIONS | INDEX_REDUCTIONS},
    **{p: _scan for p in SCANS},
}
