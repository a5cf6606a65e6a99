"""Where each stage runs: hosts x devices coloured by stage, and what crosses each stage boundary."""

from __future__ import annotations

import dataclasses

from alpaviz.core import OpGraph, Plan
from alpaviz.core.plan import format_bytes


@dataclasses.dataclass(frozen=True)
class DeviceCell:
    """One device of the cluster: where it sits, which stage runs on it and where on that stage's mesh."""

    device: int
    host: int
    slot: int
    stage: int | None
    coordinate: tuple[int, int] | None  # (row, column) on the stage's logical mesh

    @property
    def label(self) -> str:
        if self.stage is None:
            return f"d{self.device}<br>idle"
        r, c = self.coordinate or (0, 0)
        return f"d{self.device}<br>S{self.stage} ({r},{c})"


@dataclasses.dataclass(frozen=True)
class StageTransfer:
    """What one stage sends another per microbatch (forward activations, backward gradients) or per step."""

    src: int
    dst: int
    kind: str  # "forward", "backward" or "update"
    nbytes: float
    seconds: float
    inter_host: bool

    @property
    def label(self) -> str:
        where = "across hosts" if self.inter_host else "inside a host"
        each = "per step" if self.kind == "update" else "per microbatch"
        return (f"S{self.src}→S{self.dst} {self.kind}: {format_bytes(self.nbytes)} {each}, "
                f"{self.seconds * 1e3:.3g} ms {where}")


@dataclasses.dataclass(frozen=True)
class ClusterMap:
    """Hosts x devices coloured by stage, and the transfers between stages."""

    num_hosts: int
    devices_per_host: int
    cells: tuple[DeviceCell, ...]
    transfers: tuple[StageTransfer, ...]


def cluster_map(graph: OpGraph, plan: Plan) -> ClusterMap:
    """Which device runs which stage (and at which logical coordinate), and what crosses each boundary."""
    cluster = plan.cluster
    per_host = cluster.devices_per_host
    placed: dict[int, tuple[int, tuple[int, int]]] = {}
    for stage in plan.stages[:plan.num_submeshes]:  # under interleaved 1F1B a device is its submesh's first stage
        rows, cols = stage.logical_mesh
        for i, device in enumerate(stage.device_ids):
            placed[device] = (stage.index, (i // cols, i % cols))
    cells = tuple(
        DeviceCell(d, d // per_host, d % per_host, *(placed.get(d, (None, None))))
        for d in range(cluster.num_devices)
    )
    stage_of_layer = {layer: s.index for s in plan.stages for layer in s.layers}
    stage_of = {n: stage_of_layer[layer.index] for layer in plan.layers for n in layer.nodes}
    moved: dict[tuple[int, int, str], float] = {}
    for tensor in graph.tensors:
        producer = tensor.producer
        if producer is None or producer not in stage_of:
            continue
        src, role = stage_of[producer], graph.node(producer).role
        targets = {(stage_of[c], graph.node(c).role) for c in graph.consumers.get(tensor.name, ()) if c in stage_of}
        for dst, reader in targets:
            if dst == src:
                continue
            kind = "update" if "update" in (role, reader) else role
            moved[(src, dst, kind)] = moved.get((src, dst, kind), 0.0) + tensor.nbytes
    hosts = {s.index: {d // per_host for d in s.device_ids} for s in plan.stages}
    transfers = []
    for (src, dst, kind), nbytes in sorted(moved.items()):
        inter = hosts[src] != hosts[dst] or len(hosts[src]) > 1
        link = cluster.inter_host if inter and cluster.num_hosts > 1 else cluster.intra_host
        transfers.append(StageTransfer(src, dst, kind, nbytes, plan.cost_model.send_recv(nbytes, link),
                                       inter and cluster.num_hosts > 1))
    return ClusterMap(cluster.num_hosts, per_host, cells, tuple(transfers))
