"""Attention made tunable: plain attention (`Attention`, forward and backward configs
tuned separately, `FwdParams`, `BwdParams`) and its variants (`AttentionVariants`:
bias, mask, padding, window, soft cap, segment ids; `VariantConfig`)."""

from kerneltune.kernels.attention.api import Attention as Attention
from kerneltune.kernels.attention.api import AttentionBackward as AttentionBackward
from kerneltune.kernels.attention.api import (
    AttentionBackwardInterpret as AttentionBackwardInterpret,
)
from kerneltune.kernels.attention.api import AttentionInterpret as AttentionInterpret
from kerneltune.kernels.attention.api import attention as attention
from kerneltune.kernels.attention.variants import AttentionVariants as AttentionVariants
from kerneltune.kernels.attention.variants import VariantConfig as VariantConfig
