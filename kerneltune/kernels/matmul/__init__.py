"""The tiled matmul: our Pallas kernel (Triton) and, on Hopper GPUs, JAX's Mosaic GPU
matmul as a second backend; `jnp.dot` on CPUs."""

from kerneltune.kernels.matmul.api import Matmul as Matmul
from kerneltune.kernels.matmul.api import MatmulInterpret as MatmulInterpret
from kerneltune.kernels.matmul.api import matmul as matmul
from kerneltune.kernels.matmul.config import MatmulConfig as MatmulConfig
