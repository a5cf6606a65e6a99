"""One host of a Ray run: a JAX process that owns its host's stages and does what the driver says.

Each actor is its own JAX process with its own devices: the GPUs Ray gave
it when the actors ask for GPUs, otherwise K virtual CPU devices (set
through `XLA_FLAGS` before JAX starts its backend).  With the `"xla"`
transport the actors first join one JAX world (`jax.distributed`; gloo
collectives on CPUs, NCCL on GPUs), so a transfer between two
hosts is XLA's own cross-host `device_put`; its sockets bind to the address
Ray gives the node, never to every interface.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Sequence

import jax
import numpy as np

from alpaviz.core.plan import Plan, graph_fingerprint
from alpaviz.core.runtime._compile import compile_step
from alpaviz.core.runtime._cross_mesh import move_local
from alpaviz.core.runtime._stage_runner import StageError, StageRunner
from alpaviz.core.runtime._transport import ObjectStoreTransport, Transfer, XlaTransport


def free_port(address: str) -> int:
    """A port nothing listens on at `address` now (taken by the caller right after)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def make_transport(name: str, **options: Any) -> Any:
    """The actor-side backend for a transport name; NCCL's (`nccl_id`, `world_size`, `first_rank`) checks
    for cupy and a GPU here, on the host that needs them."""
    if name == "xla":
        return XlaTransport()
    if name == "object_store":
        return ObjectStoreTransport()
    from alpaviz.core.runtime._transport_nccl import NcclTransport  # cupy (checked there): GPU hosts only

    return NcclTransport(**options)


def _wait_until_ready(values: Any, timeout_s: float) -> None:
    """Wait for arrays still in flight, at most `timeout_s` (0: no limit), polling with a growing pause."""
    pending = [v for v in values if hasattr(v, "is_ready")]
    deadline, pause = time.monotonic() + timeout_s, 5e-5
    while True:
        pending = [v for v in pending if not v.is_ready()]
        if not pending:
            return
        if timeout_s and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} arrays had not arrived")
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


class HostActor:
    """Owns the stages of one host.  Created through `ray.remote`; methods run in the actor."""

    def __init__(self, host: int, devices_per_host: int, platform: str = "cpu") -> None:
        # JAX reads these when its backend starts: at the first jax.devices() or jax.distributed call.
        if platform == "cpu":  # K virtual CPU devices
            flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
            flags.append(f"--xla_force_host_platform_device_count={devices_per_host}")
            os.environ["XLA_FLAGS"] = " ".join(flags)
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        else:  # the GPUs Ray gave this actor (CUDA_VISIBLE_DEVICES)
            os.environ.setdefault("JAX_PLATFORMS", "cuda")
        self.host = host
        self.platform = platform
        self.devices_per_host = devices_per_host
        self.runners: dict[int, Any] = {}
        self.kept: dict[str, Any] = {}
        self.outbox: dict[tuple, dict[str, Any]] = {}
        self.inbox: dict[tuple, dict[str, Any]] = {}
        self.witnessed: list[Any] = []
        self.transfer_timeout_s = 0

    # ---- the JAX world ---------------------------------------------------------
    def node_address(self) -> str:
        """The address Ray gives this node (its raylet's), e.g. 127.0.0.1 for a local test Ray."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        found = [n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node]
        return found[0] if found else ray.util.get_node_ip_address()

    def coordinator_address(self) -> str:
        address = self.node_address()
        return f"{address}:{free_port(address)}"

    def join(self, coordinator: str, num_processes: int, process_id: int, transfer_timeout_s: int) -> str:
        """Join the run's JAX world; returns the address this process's transfer socket listens on."""
        address = self.node_address()
        listen = f"{address}:{free_port(address)}"
        if self.platform == "cpu":  # collectives between CPU processes; GPUs use NCCL
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.config.update("jax_cross_host_transfer_socket_address", listen)
        jax.config.update("jax_cross_host_transport_addresses", ",".join([f"{address}:0"] * 4))
        jax.config.update("jax_cross_host_transfer_timeout_seconds", int(transfer_timeout_s))
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, coordinator_bind_address=coordinator,
                                   initialization_timeout=120, heartbeat_timeout_seconds=30)
        self.transfer_timeout_s = transfer_timeout_s
        return listen

    def nccl_unique_id(self) -> tuple:
        from alpaviz.core.runtime._transport_nccl import unique_id

        return unique_id()

    def num_devices(self) -> int:
        return len(jax.local_devices())

    # ---- the step ----------------------------------------------------------------
    def setup(self, train_step, plan_json: str, abstract_args, batch_argnums, donate, compiler_options,
              stages: Sequence[int], expected_fingerprint: str, loss_reduction: str, transport: str,
              transport_options: dict | None = None) -> str:
        plan = Plan.from_json(plan_json)
        compiled = compile_step(train_step, plan, abstract_args, batch_argnums, loss_reduction=loss_reduction)
        fingerprint = graph_fingerprint(compiled.graph)
        if fingerprint != expected_fingerprint:
            raise ValueError(
                f"host {self.host} traced a different graph ({fingerprint}) than the driver "
                f"({expected_fingerprint}); use the same JAX and model code on every host"
            )
        devices = jax.local_devices()
        if len(devices) < self.devices_per_host:
            ask = (f"actor_options={{'num_gpus': {self.devices_per_host}}}" if self.platform == "gpu"
                   else "a Cluster whose devices_per_host this host can hold")
            raise ValueError(f"host {self.host} has {len(devices)} {devices[0].platform} devices but the plan's "
                             f"cluster puts {self.devices_per_host} on each host; give each actor them: {ask}")
        base = self.host * self.devices_per_host
        self.compiled = compiled
        self.transport = make_transport(transport, **(transport_options or {}))
        self.runners = {
            s: StageRunner(compiled.graph, compiled.flow, plan.stages[s],
                           [devices[d - base] for d in plan.stages[s].device_ids],
                           compiled.num_microbatches, compiled.batch_inputs, dict(compiled.aliases),
                           donate, compiler_options)
            for s in stages
        }
        return fingerprint

    def place(self, entries, *imported: dict) -> None:
        """Put graph inputs on this host's stages: arrays, or results this actor (or another) kept."""
        pool = {k: v for d in imported for k, v in d.items()}
        for runner in self.runners.values():
            runner.reset()
        for stage, name, microbatch, payload in entries:
            if isinstance(payload, tuple) and payload[0] == "kept":
                payload = self.kept[payload[1]] if payload[1] in self.kept else pool[payload[1]]
            self.runners[stage].put_input(name, payload, microbatch)

    def run(self, stage: int, role: str, microbatch: int, record: bool) -> tuple[float, float]:
        if record:
            self.runners[stage].compile_for(role, microbatch)
        start = time.time()
        produced = self.runners[stage].run(role, microbatch)
        if record:
            jax.block_until_ready(produced)
        return start, time.time()

    def send(self, transfer: Transfer, record: bool) -> tuple[Any, tuple[float, float]]:
        """The sender's half across hosts: the payload the receiver's RECV gets (object store) or None."""
        start = time.time()
        src, _, _, _, microbatch = transfer.key
        values = self.runners[src].values(transfer.tensors, microbatch)
        payload = self.transport.send(transfer, values)
        self.runners[src].sent(transfer.tensors, microbatch)
        if record and payload is None:
            jax.block_until_ready(list(values.values()))
        return payload, (start, time.time())

    def expect(self, transfer: Transfer) -> None:
        """Post the receive of a cross-host transfer where the sender posts its send (the same place in
        every actor's order); an actor outside the pair keeps XLA's transfer sequence in step."""
        try:
            arrived = self.transport.expect(transfer)
        except Exception as err:  # raised, naming the transfer, where the receiver waits for it
            arrived = err
        if transfer.key[2] in self.runners:
            self.inbox[transfer.key] = arrived
        else:
            self.witnessed.append(arrived)

    def send_local(self, key: tuple, tensors: Sequence[str], record: bool) -> tuple[float, float]:
        """A move between two stages of this host: one device_put each."""
        start = time.time()
        src, _, dst, _, microbatch = key
        values = self.runners[src].values(tensors, microbatch)
        target = self.runners[dst]
        moved = move_local(values, {t: target.sharding(t) for t in values})
        self.runners[src].sent(tensors, microbatch)
        if record:
            jax.block_until_ready(list(moved.values()))
        self.outbox[key] = moved
        return start, time.time()

    def recv(self, key: tuple, transfer: Transfer | None, payload: Any, record: bool) -> tuple[float, float]:
        """The receiver's half: a local move is already placed; a cross-host one completes its layout here
        (the all-gather inside this stage's mesh) and is waited for, so a transfer that never arrives
        fails here, naming what it was."""
        start = time.time()
        dst, microbatch = key[2], key[4]
        runner = self.runners[dst]
        if transfer is None:
            runner.give(self.outbox.pop(key), microbatch, placed=True)
            return start, time.time()
        arrived = payload if payload is not None else self.inbox.pop(key)
        try:
            if isinstance(arrived, Exception):
                raise arrived
            _wait_until_ready(arrived.values(), self.transfer_timeout_s)
            values = self.transport.receive(transfer, arrived, {t: runner.sharding(t) for t in transfer.tensors})
            jax.block_until_ready(list(values.values()))
        except Exception as err:
            waited = f" within {self.transfer_timeout_s} s" if self.transfer_timeout_s else ""
            raise StageError(
                f"the transfer of {transfer.what} over {self.transport.name!r} did not complete{waited}: "
                f"{type(err).__name__}: {str(err)[:300]}; check that host's actor is alive, or use "
                f"transport='object_store'"
            ) from None
        runner.give(values, microbatch, placed=True)
        return start, time.time()

    def free(self, stage: int, microbatch: int) -> None:
        self.runners[stage].free(microbatch)

    def finish(self, names: Sequence[tuple[int, str]]) -> None:
        """Keep this host's results for the next step and drop the step's buffers."""
        self.kept = {name: self.runners[stage].result(name) for stage, name in names}
        for runner in self.runners.values():
            runner.reset()
        failed = [w for w in self.witnessed if isinstance(w, Exception)]
        self.witnessed = []  # the driver calls this once every transfer of the step is through
        if failed:
            raise StageError(f"host {self.host} could not keep step with the other hosts' transfers: {failed[0]}")
        self.transport.step_done()

    def export(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        return {n: np.asarray(self.kept[n]) for n in names}
