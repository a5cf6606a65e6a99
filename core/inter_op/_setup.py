"""What `solve` decides before the stage DP, shared by the DP, the pin diagnosis and the baselines."""

from __future__ import annotations

import dataclasses
import functools

from alpaviz.core.cost import Cluster, CostModel
from alpaviz.core.graph import OpGraph
from alpaviz.core.inter_op._stage_dp import MeshChoice, StageCostTable
from alpaviz.core.inter_op._stage_profile import ProfileTable
from alpaviz.core.plan import graph_fingerprint


@dataclasses.dataclass(frozen=True)
class SolveSetup:
    """Everything `solve` decided before the DP: the layered graph, meshes, profiles, table."""

    graph: OpGraph
    cluster: Cluster
    cost_model: CostModel
    meshes: tuple[MeshChoice, ...]
    profiles: ProfileTable
    table: StageCostTable
    memory_limit_bytes: float
    stage_cost_name: str

    @functools.cached_property
    def graph_fingerprint(self) -> str:
        """The graph's fingerprint, computed once for every layout assembled from this setup."""
        return graph_fingerprint(self.graph)
