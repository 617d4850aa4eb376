"""Bundled kernels built on kerneltune, one folder per family.

Each family has a public function (`matmul`, `attention`, `layer_norm`, `rms_norm`,
`softmax`, `ragged_dot`, `gated_linear_unit`, `linear_softmax_cross_entropy`) that runs
through an executor (the default one unless given), the kernel
class behind it, its config type, an XLA path used on CPUs, and the Pallas path used
on GPUs. The `...Interpret` kernels run the Pallas code in the Pallas interpreter on
any device, under their own op ids: for tests and the CPU demo.
"""

from kerneltune._src.params import BwdParams as BwdParams
from kerneltune._src.params import FwdParams as FwdParams
from kerneltune.kernels.attention import Attention as Attention
from kerneltune.kernels.attention import AttentionBackward as AttentionBackward
from kerneltune.kernels.attention import AttentionBackwardInterpret as AttentionBackwardInterpret
from kerneltune.kernels.attention import AttentionInterpret as AttentionInterpret
from kerneltune.kernels.attention import AttentionVariants as AttentionVariants
from kerneltune.kernels.attention import VariantConfig as VariantConfig
from kerneltune.kernels.attention import attention as attention
from kerneltune.kernels.cross_entropy import CrossEntropyConfig as CrossEntropyConfig
from kerneltune.kernels.cross_entropy import LinearSoftmaxCrossEntropy as LinearSoftmaxCrossEntropy
from kerneltune.kernels.cross_entropy import (
    LinearSoftmaxCrossEntropyInterpret as LinearSoftmaxCrossEntropyInterpret,
)
from kerneltune.kernels.cross_entropy import (
    linear_softmax_cross_entropy as linear_softmax_cross_entropy,
)
from kerneltune.kernels.gated_linear_unit import GatedLinearUnit as GatedLinearUnit
from kerneltune.kernels.gated_linear_unit import (
    GatedLinearUnitInterpret as GatedLinearUnitInterpret,
)
from kerneltune.kernels.gated_linear_unit import GLUConfig as GLUConfig
from kerneltune.kernels.gated_linear_unit import gated_linear_unit as gated_linear_unit
from kerneltune.kernels.matmul import Matmul as Matmul
from kerneltune.kernels.matmul import MatmulConfig as MatmulConfig
from kerneltune.kernels.matmul import MatmulInterpret as MatmulInterpret
from kerneltune.kernels.matmul import matmul as matmul
from kerneltune.kernels.normalization import LayerNorm as LayerNorm
from kerneltune.kernels.normalization import LayerNormInterpret as LayerNormInterpret
from kerneltune.kernels.normalization import NormConfig as NormConfig
from kerneltune.kernels.normalization import RMSNorm as RMSNorm
from kerneltune.kernels.normalization import RMSNormInterpret as RMSNormInterpret
from kerneltune.kernels.normalization import layer_norm as layer_norm
from kerneltune.kernels.normalization import rms_norm as rms_norm
from kerneltune.kernels.ragged_dot import RaggedDot as RaggedDot
from kerneltune.kernels.ragged_dot import RaggedDotConfig as RaggedDotConfig
from kerneltune.kernels.ragged_dot import RaggedDotGradLhs as RaggedDotGradLhs
from kerneltune.kernels.ragged_dot import RaggedDotGradLhsInterpret as RaggedDotGradLhsInterpret
from kerneltune.kernels.ragged_dot import RaggedDotGradRhs as RaggedDotGradRhs
from kerneltune.kernels.ragged_dot import RaggedDotGradRhsInterpret as RaggedDotGradRhsInterpret
from kerneltune.kernels.ragged_dot import RaggedDotInterpret as RaggedDotInterpret
from kerneltune.kernels.ragged_dot import ragged_dot as ragged_dot
from kerneltune.kernels.softmax import Softmax as Softmax
from kerneltune.kernels.softmax import SoftmaxConfig as SoftmaxConfig
from kerneltune.kernels.softmax import SoftmaxInterpret as SoftmaxInterpret
from kerneltune.kernels.softmax import softmax as softmax

__all__ = [
    "Attention",
    "AttentionBackward",
    "AttentionBackwardInterpret",
    "AttentionInterpret",
    "AttentionVariants",
    "BwdParams",
    "CrossEntropyConfig",
    "FwdParams",
    "GLUConfig",
    "GatedLinearUnit",
    "GatedLinearUnitInterpret",
    "LayerNorm",
    "LayerNormInterpret",
    "LinearSoftmaxCrossEntropy",
    "LinearSoftmaxCrossEntropyInterpret",
    "Matmul",
    "MatmulConfig",
    "MatmulInterpret",
    "NormConfig",
    "RMSNorm",
    "RMSNormInterpret",
    "RaggedDot",
    "RaggedDotConfig",
    "RaggedDotGradLhs",
    "RaggedDotGradLhsInterpret",
    "RaggedDotGradRhs",
    "RaggedDotGradRhsInterpret",
    "RaggedDotInterpret",
    "Softmax",
    "SoftmaxConfig",
    "SoftmaxInterpret",
    "VariantConfig",
    "attention",
    "gated_linear_unit",
    "layer_norm",
    "linear_softmax_cross_entropy",
    "matmul",
    "ragged_dot",
    "rms_norm",
    "softmax",
]
