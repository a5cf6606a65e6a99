"""Sending a stage's outputs to a stage on another host: one interface, three backends chosen by name.

A `Transfer` names what moves (tensors, shapes, the two stages' devices);
every backend moves it in two halves that the Ray engine calls in one
global order on every host actor, so the two sides of each transfer meet:

- `"xla"`: the actors form one JAX world (`jax.distributed`) and the move is
  XLA's own cross-host `device_put`, in the boundary layout of `_cross_mesh`
  (each byte crosses once); gloo on CPUs, NCCL on GPUs.  XLA pairs the two
  sides of a transfer by their position in each process's sequence of
  cross-host transfers, so every process, not only the pair, takes part in
  every transfer (`witness`).
- `"object_store"`: the sender gathers numpy into Ray's object store, the
  receiver puts it on its mesh (the fallback: no JAX world needed).
- `"nccl"`: cupy's NCCL send/recv of device buffers handed over by DLPack,
  slab by slab in the same boundary layout (GPUs only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Literal, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpaviz.core.cost import AXIS_NAMES
from alpaviz.core.runtime._cross_mesh import BoundaryLayout, boundary_layout, move_local
from alpaviz.core.runtime._stage_runner import partition_spec

TransportName = Literal["xla", "object_store", "nccl"]
TRANSPORTS: tuple[str, ...] = ("xla", "object_store", "nccl")


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One send across hosts: which tensors, from which stage's devices to which (global device ids)."""

    key: tuple
    tensors: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    src_devices: tuple[int, ...]
    dst_devices: tuple[int, ...]
    dst_mesh_shape: tuple[int, int]
    dst_specs: tuple[Any, ...]  # the receiver's plan spec of each tensor (None: replicated)
    tile_once: bool = True

    @property
    def what(self) -> str:
        src, _, dst, _, microbatch = self.key
        names = ", ".join(self.tensors[:3]) + (f" and {len(self.tensors) - 3} more" if len(self.tensors) > 3 else "")
        return f"{names} from stage {src} to stage {dst} (microbatch {microbatch})"

    @property
    def direct(self) -> bool:
        """Each receiving device gets its own tile from a sender laid out like the receiver (needs as many
        sending devices as receiving ones); else the tensor crosses once in the boundary layout."""
        return not self.tile_once and len(self.src_devices) == len(self.dst_devices)

    def layout(self, i: int) -> BoundaryLayout:
        return boundary_layout(self.shapes[i], len(self.src_devices), len(self.dst_devices))


def check_transport_name(transport: str) -> TransportName:
    """A known transport name, or a clear error listing them (what the driver can check)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; use one of {', '.join(map(repr, TRANSPORTS))}")
    return transport  # type: ignore[return-value]


def expecting_hosts(transport: str, sender: int, receiver: int, hosts: Iterable[int]) -> list[int]:
    """The hosts that post their half of a cross-host transfer at the send's place in the global order:
    every other host for "xla" (XLA pairs transfers by their place in each process's sequence), the
    receiver for "nccl", none for the object store (the receiver takes the payload at its RECV)."""
    if transport == "xla":
        return [h for h in hosts if h != sender]
    return [receiver] if transport == "nccl" else []


def check_transport(transport: str) -> TransportName:
    """Validate a transport name; NCCL needs cupy and a visible CUDA device (checked where it runs)."""
    check_transport_name(transport)
    if transport == "nccl":
        try:
            import cupy
        except ImportError:
            raise ValueError(
                "transport='nccl' needs cupy (pip install 'alpaviz[gpu]') and CUDA GPUs; use transport='xla' "
                "(XLA's own transfers, NCCL on GPUs) or 'object_store'"
            ) from None
        if not cupy.is_available():
            raise ValueError(
                "transport='nccl' needs a CUDA GPU, but cupy sees none on this machine; use transport='xla' "
                "(gloo on CPUs) or 'object_store' (host memory through Ray)"
            )
    return transport  # type: ignore[return-value]


class XlaTransport:
    """Cross-host `device_put` inside one JAX world; the receiver completes its layout on its own mesh."""

    name = "xla"

    def __init__(self) -> None:
        self._in_flight: list[Any] = []  # the sender's halves, kept alive until the step ends

    def _shardings(self, transfer: Transfer, i: int) -> tuple[NamedSharding, NamedSharding]:
        """The two sides of the cross-host put: one HLO sharding on the sender's and the receiver's devices."""
        devices = jax.devices()
        if transfer.direct:
            spec = partition_spec(transfer.dst_specs[i])
            meshes = [Mesh(np.array([devices[d] for d in ids]).reshape(transfer.dst_mesh_shape), AXIS_NAMES)
                      for ids in (transfer.src_devices, transfer.dst_devices)]
        else:
            layout = transfer.layout(i)
            spec = PartitionSpec() if layout.dim is None else PartitionSpec(*([None] * layout.dim), "boundary")
            meshes = [Mesh(np.array([devices[d] for d in ids[:layout.pieces]]), ("boundary",))
                      for ids in (transfer.src_devices, transfer.dst_devices)]
        return NamedSharding(meshes[0], spec), NamedSharding(meshes[1], spec)

    def send(self, transfer: Transfer, values: Mapping[str, Any]) -> None:
        for i, t in enumerate(transfer.tensors):
            src, dst = self._shardings(transfer, i)
            staged = jax.device_put(values[t], src)  # inside the sender's mesh
            self._in_flight += [staged, jax.device_put(staged, dst)]

    def expect(self, transfer: Transfer) -> dict[str, Any]:
        """Post the receive (or, on a process outside the pair, keep the transfer sequence in step)."""
        arrived = {}
        for i, t in enumerate(transfer.tensors):
            src, dst = self._shardings(transfer, i)
            placeholder = jax.make_array_from_single_device_arrays(transfer.shapes[i], src, [],
                                                                   dtype=np.dtype(transfer.dtypes[i]))
            arrived[t] = jax.device_put(placeholder, dst)
        return arrived

    def receive(self, transfer: Transfer, arrived: Mapping[str, Any], dst_shardings: Mapping[str, Any]) -> dict[str, Any]:
        """Complete the receiver's layout inside its mesh (the local all-gather)."""
        return move_local({t: arrived[t] for t in transfer.tensors}, dst_shardings)

    def step_done(self) -> None:
        self._in_flight = []


class ObjectStoreTransport:
    """numpy through Ray's object store: the whole tensor crosses once, through host memory."""

    name = "object_store"

    def send(self, transfer: Transfer, values: Mapping[str, Any]) -> dict:
        return {t: np.asarray(values[t]) for t in transfer.tensors}

    def receive(self, transfer: Transfer, arrived: Mapping[str, Any], dst_shardings: Mapping[str, Any]) -> dict[str, Any]:
        return move_local({t: arrived[t] for t in transfer.tensors}, dst_shardings)

    def step_done(self) -> None:
        pass
