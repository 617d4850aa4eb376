"""Our Pallas GPU softmax with a tuned warp count, XLA on CPUs."""

from kerneltune.kernels.softmax.api import Softmax as Softmax
from kerneltune.kernels.softmax.api import SoftmaxInterpret as SoftmaxInterpret
from kerneltune.kernels.softmax.api import softmax as softmax
from kerneltune.kernels.softmax.config import SoftmaxConfig as SoftmaxConfig
