"""JAX's Pallas GPU attention made tunable: forward and backward configs tuned
separately (`FwdParams`, `BwdParams`), XLA on CPUs."""

from kerneltune.kernels.attention.api import Attention as Attention
from kerneltune.kernels.attention.api import AttentionBackward as AttentionBackward
from kerneltune.kernels.attention.api import (
    AttentionBackwardInterpret as AttentionBackwardInterpret,
)
from kerneltune.kernels.attention.api import AttentionInterpret as AttentionInterpret
from kerneltune.kernels.attention.api import attention as attention
