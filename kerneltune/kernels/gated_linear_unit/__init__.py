"""The gated linear unit (SwiGLU, GEGLU, ...): XLA, our fused Pallas kernel, or
tokamax's where installed."""

from kerneltune.kernels.gated_linear_unit.api import GatedLinearUnit as GatedLinearUnit
from kerneltune.kernels.gated_linear_unit.api import (
    GatedLinearUnitInterpret as GatedLinearUnitInterpret,
)
from kerneltune.kernels.gated_linear_unit.api import gated_linear_unit as gated_linear_unit
from kerneltune.kernels.gated_linear_unit.config import GLUConfig as GLUConfig
