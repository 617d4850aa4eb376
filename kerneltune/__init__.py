"""kerneltune: picks the best config for every JAX kernel call.

Selection order: explicit override → scoped overlay → memory cache → persistent cache →
autotuning on the device → the kernel's heuristic → a clear error.
"""

from kerneltune._src.caching.cache import ConfigCache as ConfigCache
from kerneltune._src.caching.cache import overlay_cache as overlay_cache
from kerneltune._src.caching.cache_entry import CacheEntry as CacheEntry
from kerneltune._src.caching.default_cache import (
    default_persistent_cache as default_persistent_cache,
)
from kerneltune._src.caching.manifest import load_manifest as load_manifest
from kerneltune._src.caching.manifest import save_manifest as save_manifest
from kerneltune._src.caching.persistent import PersistentCache as PersistentCache
from kerneltune._src.caching.result import AutotuningResult as AutotuningResult
from kerneltune._src.caching.result import Entry as Entry
from kerneltune._src.core.coordination import AgreementError as AgreementError
from kerneltune._src.core.coordination import AgreementTimeoutError as AgreementTimeoutError
from kerneltune._src.core.devices import device_fingerprint as device_fingerprint
from kerneltune._src.core.devices import device_kind as device_kind
from kerneltune._src.core.devices import get_device_platform as get_device_platform
from kerneltune._src.core.kernel_types import Cfg as Cfg
from kerneltune._src.core.kernel_types import Out as Out
from kerneltune._src.core.keys import abstractify as abstractify
from kerneltune._src.core.keys import from_json as from_json
from kerneltune._src.core.keys import sharding_fingerprint as sharding_fingerprint
from kerneltune._src.core.keys import stable_json as stable_json
from kerneltune._src.core.keys import to_json as to_json
from kerneltune._src.core.labels import extract_labels_from_hlo_text as extract_labels_from_hlo_text
from kerneltune._src.core.labels import find_labels_in_lowered as find_labels_in_lowered
from kerneltune._src.core.labels import label as label
from kerneltune._src.execution.default import default_executor as default_executor
from kerneltune._src.execution.default import set_default_executor as set_default_executor
from kerneltune._src.execution.executor import ConfigChooser as ConfigChooser
from kerneltune._src.execution.executor import Executor as Executor
from kerneltune._src.kernel.base import Invocation as Invocation
from kerneltune._src.kernel.base import Kernel as Kernel
from kerneltune._src.kernel.base import (
    default_key_builder_with_sharding as default_key_builder_with_sharding,
)
from kerneltune._src.kernel.recording import Record as Record
from kerneltune._src.kernel.recording import clear_invocations as clear_invocations
from kerneltune._src.kernel.recording import get_invocations as get_invocations
from kerneltune._src.kernel.recording import record_calls as record_calls
from kerneltune._src.kernel.recording import record_invocation as record_invocation
from kerneltune._src.params import BwdParams as BwdParams
from kerneltune._src.params import FwdParams as FwdParams
from kerneltune._src.selection.chain import AutotunePolicy as AutotunePolicy
from kerneltune._src.selection.chain import CacheMissError as CacheMissError
from kerneltune._src.selection.chain import ConfigSelectorChain as ConfigSelectorChain
from kerneltune._src.selection.chain import FirstCallBudget as FirstCallBudget
from kerneltune._src.selection.chain import forward_autotune_only as forward_autotune_only
from kerneltune._src.selection.chain import policy_override as policy_override
from kerneltune._src.tuning.report import CandidateResult as CandidateResult
from kerneltune._src.tuning.report import TuningReport as TuningReport
from kerneltune._src.tuning.search import CoordinateDescent as CoordinateDescent
from kerneltune._src.tuning.search import Exhaustive as Exhaustive
from kerneltune._src.tuning.search import SearchStrategy as SearchStrategy
from kerneltune._src.tuning.search import SuccessiveHalving as SuccessiveHalving
from kerneltune._src.tuning.timing import CuptiTimer as CuptiTimer
from kerneltune._src.tuning.timing import Timer as Timer
from kerneltune._src.tuning.timing import WallClockTimer as WallClockTimer
from kerneltune._src.tuning.tuner import NoCandidatesError as NoCandidatesError
from kerneltune._src.tuning.tuner import Tuner as Tuner
from kerneltune._src.version import __version__ as __version__
from kerneltune._src.workflows.batch import pmap_with_config as pmap_with_config
from kerneltune._src.workflows.batch import vmap_with_config as vmap_with_config
from kerneltune._src.workflows.benchmarking import autotune as autotune
from kerneltune._src.workflows.benchmarking import benchmark as benchmark
from kerneltune._src.workflows.explain import Explanation as Explanation
from kerneltune._src.workflows.explain import explain as explain
from kerneltune._src.workflows.lowered_configs import labels_to_configs as labels_to_configs
from kerneltune._src.workflows.offline import autotune_lowered as autotune_lowered
from kerneltune._src.workflows.offline import autotune_recorded as autotune_recorded
from kerneltune._src.workflows.verify import AgreementCheck as AgreementCheck
from kerneltune._src.workflows.verify import verify_agreement as verify_agreement

__all__ = [
    "AgreementCheck",
    "AgreementError",
    "AgreementTimeoutError",
    "AutotunePolicy",
    "AutotuningResult",
    "BwdParams",
    "CacheEntry",
    "CacheMissError",
    "CandidateResult",
    "Cfg",
    "ConfigCache",
    "ConfigChooser",
    "ConfigSelectorChain",
    "CoordinateDescent",
    "CuptiTimer",
    "Entry",
    "Executor",
    "Exhaustive",
    "Explanation",
    "FirstCallBudget",
    "FwdParams",
    "Invocation",
    "Kernel",
    "NoCandidatesError",
    "Out",
    "PersistentCache",
    "Record",
    "SearchStrategy",
    "SuccessiveHalving",
    "Timer",
    "Tuner",
    "TuningReport",
    "WallClockTimer",
    "__version__",
    "abstractify",
    "autotune",
    "autotune_lowered",
    "autotune_recorded",
    "benchmark",
    "clear_invocations",
    "default_executor",
    "default_key_builder_with_sharding",
    "default_persistent_cache",
    "device_fingerprint",
    "device_kind",
    "explain",
    "extract_labels_from_hlo_text",
    "find_labels_in_lowered",
    "forward_autotune_only",
    "from_json",
    "get_device_platform",
    "get_invocations",
    "label",
    "labels_to_configs",
    "load_manifest",
    "overlay_cache",
    "pmap_with_config",
    "policy_override",
    "record_calls",
    "record_invocation",
    "save_manifest",
    "set_default_executor",
    "sharding_fingerprint",
    "stable_json",
    "to_json",
    "verify_agreement",
    "vmap_with_config",
]


def __getattr__(name: str):
    # `kt.kernels.attention(...)` after a bare `import kerneltune as kt`: the bundled
    # kernels load on first use, so importing kerneltune stays light.
    if name == "kernels":
        import importlib

        return importlib.import_module("kerneltune.kernels")
    raise AttributeError(f"module 'kerneltune' has no attribute {name!r}")
