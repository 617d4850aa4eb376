"""Layer norm and RMS norm: our Pallas GPU kernels with tuned block sizes and warps,
XLA on CPUs."""

from kerneltune.kernels.normalization.api import LayerNorm as LayerNorm
from kerneltune.kernels.normalization.api import LayerNormInterpret as LayerNormInterpret
from kerneltune.kernels.normalization.api import RMSNorm as RMSNorm
from kerneltune.kernels.normalization.api import RMSNormInterpret as RMSNormInterpret
from kerneltune.kernels.normalization.api import layer_norm as layer_norm
from kerneltune.kernels.normalization.api import rms_norm as rms_norm
from kerneltune.kernels.normalization.config import NormConfig as NormConfig
