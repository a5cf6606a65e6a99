"""The `"nccl"` transport: cupy's NCCL send/recv between GPUs of different host actors.

Unverified: this machine has no GPU, so this backend has not run yet (the
test marked `gpu` needs two).  It moves a tensor in the same boundary
layout as the `"xla"` transport: slab i goes from the i-th sending device
to the i-th receiving device, each byte once, and the receiver completes
its layout inside its mesh.  Buffers change hands without copies through
DLPack (`cupy.from_dlpack`, `jax.dlpack.from_dlpack`).  One NCCL
communicator spans every device of the run (rank = the device's index in
the run's device order); sends and receives are matched because the
driver posts both halves of each transfer at the same place in one global
order.  Each transfer's sends (and receives) of one process are one NCCL
group, as NCCL requires when one thread drives several ranks.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpaviz.core.runtime._cross_mesh import move_local
from alpaviz.core.runtime._transport import Transfer, check_transport


def unique_id() -> tuple:
    """A new NCCL id, made on one host and handed to every actor by the driver."""
    check_transport("nccl")
    from cupy.cuda import nccl

    return nccl.get_unique_id()


class NcclTransport:
    """Slabs between GPUs over NCCL; a receiver's slabs become one JAX array on its boundary layout."""

    name = "nccl"

    def __init__(self, nccl_id: tuple, world_size: int, first_rank: int) -> None:
        """This process's devices are ranks `first_rank`, `first_rank + 1`, ... of `world_size`."""
        check_transport("nccl")
        import cupy
        from cupy.cuda import nccl

        self._cupy, self._nccl = cupy, nccl
        self._device_of = {first_rank + i: d for i, d in enumerate(jax.local_devices())}
        self._comms: dict[int, Any] = {}
        nccl.groupStart()  # several GPUs of one process join the communicator together
        for rank, device in self._device_of.items():
            with cupy.cuda.Device(device.local_hardware_id):
                self._comms[rank] = nccl.NcclCommunicator(world_size, nccl_id, rank)
        nccl.groupEnd()
        self._in_flight: list[Any] = []

    def _boundary(self, transfer: Transfer, i: int, ranks: tuple[int, ...]) -> NamedSharding:
        """The boundary layout on one side's devices (all of them this process's)."""
        layout = transfer.layout(i)
        spec = PartitionSpec() if layout.dim is None else PartitionSpec(*([None] * layout.dim), "boundary")
        devices = np.array([self._device_of[r] for r in ranks[:layout.pieces]])
        return NamedSharding(Mesh(devices, ("boundary",)), spec)

    def _grouped(self, calls: list[tuple[int, Any]]) -> None:
        """Issue point-to-point calls, each `(rank, call(comm, stream))`, as one NCCL group: a process that
        drives several GPUs must, or a send on one rank waits for a receive its own thread has not posted."""
        cupy, nccl = self._cupy, self._nccl
        nccl.groupStart()
        try:
            for rank, call in calls:
                with cupy.cuda.Device(self._device_of[rank].local_hardware_id):
                    call(self._comms[rank], cupy.cuda.get_current_stream().ptr)
        finally:
            nccl.groupEnd()

    def send(self, transfer: Transfer, values: Mapping[str, Any]) -> None:
        cupy, nccl = self._cupy, self._nccl
        rank_of = {d: r for r, d in self._device_of.items()}
        calls = []
        for i, t in enumerate(transfer.tensors):
            staged = jax.device_put(values[t], self._boundary(transfer, i, transfer.src_devices))
            jax.block_until_ready(staged)  # JAX's stream is done with it before NCCL's reads it
            shards = sorted(staged.addressable_shards, key=lambda s: transfer.src_devices.index(rank_of[s.device]))
            for k, shard in enumerate(shards):
                src, dst = transfer.src_devices[k], transfer.dst_devices[k]
                with cupy.cuda.Device(self._device_of[src].local_hardware_id):
                    buffer = cupy.from_dlpack(shard.data)
                calls.append((src, lambda comm, stream, b=buffer, dst=dst: comm.send(
                    b.data.ptr, b.size, _nccl_dtype(nccl, b.dtype), dst, stream)))
                self._in_flight.append(buffer)
            self._in_flight.append(staged)
        self._grouped(calls)

    def expect(self, transfer: Transfer) -> dict[str, Any]:
        """Post a receive per slab into fresh buffers, as one group (not waited for here: `receive` waits)."""
        cupy, nccl = self._cupy, self._nccl
        posted, calls = {}, []
        for i, t in enumerate(transfer.tensors):
            sharding = self._boundary(transfer, i, transfer.dst_devices)
            dtype = np.dtype(transfer.dtypes[i])
            buffers = []
            for k in range(len(sharding.device_set)):
                src, dst = transfer.src_devices[k], transfer.dst_devices[k]
                with cupy.cuda.Device(self._device_of[dst].local_hardware_id):
                    buffer = cupy.empty(sharding.shard_shape(transfer.shapes[i]), dtype=dtype)
                calls.append((dst, lambda comm, stream, b=buffer, src=src: comm.recv(
                    b.data.ptr, b.size, _nccl_dtype(nccl, b.dtype), src, stream)))
                buffers.append((dst, buffer))
            posted[t] = (sharding, buffers)
        self._grouped(calls)
        return posted

    def receive(self, transfer: Transfer, arrived: Mapping[str, Any], dst_shardings: Mapping[str, Any]) -> dict[str, Any]:
        """Wait for the slabs, hand them to JAX without a copy, and complete the receiver's layout."""
        out = {}
        for i, t in enumerate(transfer.tensors):
            sharding, buffers = arrived[t]
            slabs = []
            for rank, buffer in buffers:
                with self._cupy.cuda.Device(self._device_of[rank].local_hardware_id):
                    self._cupy.cuda.get_current_stream().synchronize()
                    slabs.append(jax.dlpack.from_dlpack(buffer))
            out[t] = jax.make_array_from_single_device_arrays(transfer.shapes[i], sharding, slabs)
        return move_local(out, dst_shardings)

    def step_done(self) -> None:
        for rank, device in self._device_of.items():
            with self._cupy.cuda.Device(device.local_hardware_id):
                self._cupy.cuda.get_current_stream().synchronize()
        self._in_flight = []


def _nccl_dtype(nccl: Any, dtype: Any) -> int:
    names = {"float32": "NCCL_FLOAT32", "float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16",
             "float64": "NCCL_FLOAT64", "int32": "NCCL_INT32", "int64": "NCCL_INT64", "int8": "NCCL_INT8",
             "uint8": "NCCL_UINT8"}
    name = names.get(np.dtype(dtype).name)
    if name is None or not hasattr(nccl, name):
        raise ValueError(f"transport='nccl' cannot send {np.dtype(dtype).name} tensors; use transport='xla'")
    return getattr(nccl, name)
