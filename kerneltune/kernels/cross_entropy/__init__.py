"""The loss head: a linear layer and softmax cross-entropy over a large vocabulary,
materialised (XLA), in chunks of tokens, or fused in a Pallas kernel that never holds
the logits."""

from kerneltune.kernels.cross_entropy.api import (
    LinearSoftmaxCrossEntropy as LinearSoftmaxCrossEntropy,
)
from kerneltune.kernels.cross_entropy.api import (
    LinearSoftmaxCrossEntropyInterpret as LinearSoftmaxCrossEntropyInterpret,
)
from kerneltune.kernels.cross_entropy.api import (
    linear_softmax_cross_entropy as linear_softmax_cross_entropy,
)
from kerneltune.kernels.cross_entropy.config import CrossEntropyConfig as CrossEntropyConfig
