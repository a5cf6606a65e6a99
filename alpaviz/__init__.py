"""alpaviz: plan, see, pin, re-solve and launch parallel JAX training from a notebook.

Example:
    >>> import alpaviz as av
    >>> train_step, params, batch = av.models.gpt()
    >>> graph = av.trace(train_step, params, batch)
"""

from alpaviz import models as models
from alpaviz.core import Cluster as Cluster
from alpaviz.core import CostModel as CostModel
from alpaviz.core import DeviceSpec as DeviceSpec
from alpaviz.core import Link as Link
from alpaviz.core import LogicalMesh as LogicalMesh
from alpaviz.core import OpGraph as OpGraph
from alpaviz.core import Pins as Pins
from alpaviz.core import Plan as Plan
from alpaviz.core import PlanFormatError as PlanFormatError
from alpaviz.core import make_spec as make_spec
from alpaviz.core import mark_layer as mark_layer
from alpaviz.core import manual_plan as manual_plan
from alpaviz.core import parallelize as parallelize
from alpaviz.core import predicted_timeline as predicted_timeline
from alpaviz.core import trace as trace
from alpaviz import baselines as baselines
from alpaviz.core import InfeasiblePinsError as InfeasiblePinsError
from alpaviz.core import ModelTooLargeError as ModelTooLargeError
from alpaviz.core import StageProfileCache as StageProfileCache
from alpaviz.core import cluster_layers as cluster_layers
from alpaviz.core import resolve as resolve
from alpaviz.core import solve as solve

__version__ = "0.1.0"


def editor(*args, **kwargs):
    """Open the visual plan editor (`alpaviz.widgets.editor`); the UI stack is imported on first use."""
    from alpaviz.widgets import editor as _editor

    return _editor(*args, **kwargs)


__all__ = [
    "models", "Cluster", "CostModel", "DeviceSpec", "Link", "LogicalMesh", "OpGraph", "Pins",
    "Plan", "PlanFormatError", "editor", "make_spec", "mark_layer", "trace",
]
__all__ += [
    "baselines", "InfeasiblePinsError", "ModelTooLargeError", "StageProfileCache", "cluster_layers",
    "resolve", "solve",
]
__all__ += ["manual_plan", "predicted_timeline", "parallelize"]  # the runtime

# the intra-operator pass: av.solve_sharding(step, params, batch, mesh_shape=(r, c)), av.shard_step(...)
from alpaviz.core import ShardingInfeasibleError as ShardingInfeasibleError
from alpaviz.core import shard_step as shard_step
from alpaviz.core import solve_sharding_auto as solve_sharding

__all__ += ["ShardingInfeasibleError", "shard_step", "solve_sharding"]
