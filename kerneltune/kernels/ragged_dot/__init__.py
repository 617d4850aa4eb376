"""The grouped matmul of mixture-of-experts layers (`jax.lax.ragged_dot`): our Pallas
grouped GEMM (Triton), JAX's Mosaic GPU kernels on Hopper, tokamax's where installed,
and XLA on CPUs; forward, d_lhs and d_rhs each tuned for itself."""

from kerneltune.kernels.ragged_dot.api import RaggedDot as RaggedDot
from kerneltune.kernels.ragged_dot.api import RaggedDotGradLhs as RaggedDotGradLhs
from kerneltune.kernels.ragged_dot.api import (
    RaggedDotGradLhsInterpret as RaggedDotGradLhsInterpret,
)
from kerneltune.kernels.ragged_dot.api import RaggedDotGradRhs as RaggedDotGradRhs
from kerneltune.kernels.ragged_dot.api import (
    RaggedDotGradRhsInterpret as RaggedDotGradRhsInterpret,
)
from kerneltune.kernels.ragged_dot.api import RaggedDotInterpret as RaggedDotInterpret
from kerneltune.kernels.ragged_dot.api import ragged_dot as ragged_dot
from kerneltune.kernels.ragged_dot.config import RaggedDotConfig as RaggedDotConfig
