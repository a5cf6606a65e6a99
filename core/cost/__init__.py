"""The cost pass: the hardware (cluster, devices, links, logical meshes) and the price of work on it.

This module only re-exports: the names other passes and users may rely on.
"""

from alpaviz.core.cost._cluster import AXIS_NAMES as AXIS_NAMES
from alpaviz.core.cost._cluster import Cluster as Cluster
from alpaviz.core.cost._cluster import DeviceSpec as DeviceSpec
from alpaviz.core.cost._cluster import Link as Link
from alpaviz.core.cost._cluster import LogicalMesh as LogicalMesh
from alpaviz.core.cost._cost_model import CostModel as CostModel
from alpaviz.core.cost._calibrate import CACHE_DIR as CACHE_DIR
from alpaviz.core.cost._calibrate import Calibration as Calibration
from alpaviz.core.cost._calibrate import calibrate as calibrate
from alpaviz.core.cost._cost_model import CostModelProtocol as CostModelProtocol

__all__ = [
    "CACHE_DIR",
    "calibrate",
    "Calibration",
    "AXIS_NAMES",
    "Cluster",
    "CostModel",
    "CostModelProtocol",
    "DeviceSpec",
    "Link",
    "LogicalMesh",
]
