"""FLOP counts per primitive, from shapes and plain params alone."""

from __future__ import annotations

import math
from typing import Any, Sequence

Shape = tuple[int, ...]

# One floating-point operation per output element.
ELEMENTWISE = frozenset(
    """
    add sub mul div rem max min pow integer_pow neg abs sign exp exp2 log log1p expm1
    tanh logistic sin cos tan sqrt rsqrt cbrt erf erfc erf_inv square reciprocal
    select_n clamp gt ge lt le eq ne and or not xor atan2 floor ceil round is_finite
    nextafter add_any
    """.split()
)

# Pure data movement: no arithmetic.
DATA_MOVEMENT = frozenset(
    """
    broadcast_in_dim reshape transpose squeeze expand_dims convert_element_type slice
    dynamic_slice dynamic_update_slice concatenate gather pad copy copy_p iota rev
    select_and_gather_add stop_gradient layer_boundary split device_put sharding_constraint stack
    """.split()
)

REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin "
    "cumsum cumprod cummax cumlogsumexp reduce_precision".split()
)


def dot_general_flops(lhs: Shape, rhs: Shape, dimension_numbers: Any) -> float:
    """2 * (output elements) * (contracted elements)."""
    (lhs_contract, _rhs_contract), (lhs_batch, _rhs_batch) = dimension_numbers
    contracted = math.prod(lhs[d] for d in lhs_contract)
    batch = math.prod(lhs[d] for d in lhs_batch)
    lhs_free = math.prod(s for d, s in enumerate(lhs) if d not in lhs_contract and d not in lhs_batch)
    rhs_contract, rhs_batch = dimension_numbers[0][1], dimension_numbers[1][1]
    rhs_free = math.prod(s for d, s in enumerate(rhs) if d not in rhs_contract and d not in rhs_batch)
    return 2.0 * batch * lhs_free * rhs_free * contracted


def conv_flops(rhs: Shape, out: Shape, rhs_out_feature_dim: int) -> float:
    """2 * (output elements) * (kernel elements per output feature)."""
    per_output = math.prod(rhs) // rhs[rhs_out_feature_dim]
    return 2.0 * math.prod(out) * per_output


def primitive_flops(
    primitive: str,
    in_shapes: Sequence[Shape],
    out_shapes: Sequence[Shape],
    params: dict[str, Any],
) -> float:
    """FLOPs of one application; 0 for data movement and unknown primitives."""
    if primitive == "dot_general":
        return dot_general_flops(in_shapes[0], in_shapes[1], params["dimension_numbers"])
    if primitive == "conv_general_dilated":
        rhs_spec = params["dimension_numbers"][1]
        return conv_flops(in_shapes[1], out_shapes[0], rhs_spec[0])
    if primitive in ELEMENTWISE:
        return float(sum(math.prod(s) for s in out_shapes))
    if primitive in REDUCTIONS:
        return float(math.prod(in_shapes[0])) if in_shapes else 0.0
    if primitive in ("scatter-add", "scatter_add", "scatter"):
        return float(math.prod(in_shapes[2])) if len(in_shapes) > 2 else 0.0
    return 0.0
