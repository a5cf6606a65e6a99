"""Moving tensors between stage meshes: device_put on one host, host memory or NCCL across hosts.

On one host the whole move is one `jax.device_put` to the receiving
stage's `NamedSharding`; XLA copies only the shards each receiving device
needs.  Across hosts (Ray) a sender turns its arrays into numpy (through
Ray's object store); NCCL through cupy is offered only when a CUDA GPU is
really there.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

import jax
import numpy as np

Transport = Literal["object_store", "nccl"]


def move_local(values: Mapping[str, Any], shardings: Mapping[str, Any]) -> dict[str, Any]:
    """Reshard each value onto the receiver's sharding (one async device_put per tensor)."""
    return {name: jax.device_put(value, shardings[name]) for name, value in values.items()}


def to_host(values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Gather values into numpy for the object store (the sender's half of a cross-host move)."""
    return {name: np.asarray(value) for name, value in values.items()}


def check_transport(transport: str) -> Transport:
    """Validate a transport name; NCCL needs cupy and a visible CUDA device."""
    if transport == "object_store":
        return "object_store"
    if transport != "nccl":
        raise ValueError(f"unknown transport {transport!r}; use 'object_store' or 'nccl'")
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise ValueError(
            "transport='nccl' needs cupy (pip install 'alpaviz[gpu]'); use transport='object_store'"
        ) from None
    if not cupy.is_available():
        raise ValueError(
            "transport='nccl' needs a CUDA GPU, but cupy sees none on this machine; "
            "use transport='object_store' (host memory through Ray)"
        )
    raise NotImplementedError(
        "transport='nccl' is not implemented yet in alpaviz; use transport='object_store'"
    )
