"""The model zoo: GPT, MoE and Wide-ResNet training steps at test and paper sizes."""

from alpaviz.core.models._common import ModelSpec as ModelSpec
from alpaviz.core.models._common import make_train_step as make_train_step
from alpaviz.core.models._gpt import GPT_CONFIGS as GPT_CONFIGS
from alpaviz.core.models._gpt import GPTConfig as GPTConfig
from alpaviz.core.models._gpt import gpt as gpt
from alpaviz.core.models._mlp import mlp as mlp
from alpaviz.core.models._moe import MOE_CONFIGS as MOE_CONFIGS
from alpaviz.core.models._moe import MoEConfig as MoEConfig
from alpaviz.core.models._moe import moe as moe
from alpaviz.core.models._wresnet import WRESNET_CONFIGS as WRESNET_CONFIGS
from alpaviz.core.models._wresnet import WResNetConfig as WResNetConfig
from alpaviz.core.models._wresnet import wresnet as wresnet

__all__ = [
    "ModelSpec", "make_train_step", "GPTConfig", "GPT_CONFIGS", "gpt",
    "mlp", "MoEConfig", "MOE_CONFIGS", "moe", "WResNetConfig", "WRESNET_CONFIGS", "wresnet",
]
