"""The tiled matmul written in Pallas (Triton on GPUs), `jnp.dot` on CPUs."""

from kerneltune.kernels.matmul.api import Matmul as Matmul
from kerneltune.kernels.matmul.api import MatmulInterpret as MatmulInterpret
from kerneltune.kernels.matmul.api import matmul as matmul
from kerneltune.kernels.matmul.config import MatmulConfig as MatmulConfig
