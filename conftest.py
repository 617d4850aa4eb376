"""Test setup: several fake CPU devices, strict dtype promotion, an isolated cache."""

import importlib.metadata
import os
import re
import tempfile


def _jaxlib_version() -> tuple[int, ...]:
    """The installed jaxlib's release numbers ("0.10.2" -> (0, 10, 2)), read without
    importing it; () where its metadata cannot be read (a build from source)."""
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return ()
    release = re.match(r"[\d.]*\d", version)
    return tuple(int(part) for part in release.group().split(".")) if release else ()


def _cpu_compile_flags() -> str:
    """The XLA:CPU flags that make the tests' compiles cheaper without changing what
    their programs compute."""
    flags = " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    # XLA:CPU's MLIR fusion emitters (its default) took about twice as long to compile a
    # fusion as its classic emitters: a tiny op's compile 16 ms against 7 ms, and four
    # kernel test files (conformance, ragged_dot's offset, Mosaic attention, cross
    # entropy) 84 s against 51 s on 2 cores. jaxlib 0.10.0 to 0.11.0 take the flag;
    # 0.11.1 removed it, and XLA aborts the process on a flag it does not know.
    if (0, 10) <= _jaxlib_version() <= (0, 11, 0):
        flags += " --xla_cpu_use_fusion_emitters=false"
    return flags


# Must be set before JAX initialises its backends. The tests' programs are tiny: the suite
# spends its time compiling them, not running them, so LLVM's optimisation passes are
# skipped (compiles about twice as fast; what a program computes is the same). Worker
# processes the tests start inherit these flags.
# Only on a CPU: a GPU run of the tests (`JAX_PLATFORMS=cuda`) compiles its kernels as
# users do.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=4"
    + (_cpu_compile_flags() if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu" else ""),
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# NumPy's OpenBLAS starts a thread per core, and its idle threads spin: beside other
# busy processes (CI's "under load"), the tuner's small least-squares solves
# (`config_space`) took 3-8x as long as on one thread (the warm-start replay: 3.4 s
# against 7.7-27.7 s). The tests' arrays are small; one thread loses nothing. OpenBLAS
# reads this when NumPy is first imported: pyproject.toml's addopts turn off jaxtyping's
# pytest plugin, the one plugin that imported NumPy before this file. Processes the
# tests start inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# XLA:CPU runs programs on a pool of as many threads as cores (2 in CI). JAX's Mosaic GPU
# interpreter runs a kernel of two warpgroups as two programs on threads of their own,
# from inside a host callback, and each waits at the kernel's barriers in callbacks of
# its own: with the callback and one warpgroup holding both pool threads, the other
# warpgroup never ran and the test hung (py-spy, jax 0.10.2, `pytest -n 2` on 2 cores).
# PJRT_NPROC sizes that pool (jaxlib reads it when it creates the CPU client).
os.environ.setdefault("PJRT_NPROC", "8")
# Never touch the user's real cache from tests.
os.environ["KERNELTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="kerneltune-test-cache-")

# After the environment above, which JAX reads when it is imported (the functions before
# it make ruff's E402 count these as late).
import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")


def pytest_collection_modifyitems(config, items):
    has_gpu = any(d.platform == "gpu" for d in jax.devices()) if jax.devices() else False
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)
