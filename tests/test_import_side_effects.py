"""Importing kerneltune leaves JAX untouched: no backend started, nothing patched, so
`jax.distributed.initialize()` may follow it (docs/cluster.md relies on that)."""

import socket
import subprocess
import sys
import textwrap

import pytest


def run_python(code):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_import_starts_no_backend_and_patches_nothing():
    out = run_python(
        """
        import jax.profiler
        originals = (jax.profiler.start_trace, jax.profiler.start_server)
        import kerneltune, kerneltune.kernels
        from kerneltune._src.core import jax_compat
        print(jax_compat.backends_initialized())
        print((jax.profiler.start_trace, jax.profiler.start_server) == originals)
        """
    )
    assert out.split() == ["False", "True"]


def test_jax_distributed_initialize_may_follow_the_import():
    out = run_python(
        f"""
        import kerneltune
        import jax
        jax.distributed.initialize(
            coordinator_address="127.0.0.1:{free_port()}", num_processes=1, process_id=0,
            initialization_timeout=60,
        )
        import kerneltune.kernels
        print(jax.process_count(), float(kerneltune.kernels.softmax(jax.numpy.zeros(4)).sum()))
        """
    )
    assert out.split() == ["1", "1.0"]


def test_the_workers_parent_starts_no_backend(tmp_path):
    # The parent of `kerneltune tune --workers N` reads the manifest and deals the keys;
    # a backend started there would hold the GPU its workers need.
    out = run_python(
        f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent.parent)!r})
        import jax.numpy as jnp
        import kerneltune as kt
        from kerneltune._src.core import jax_compat
        from kerneltune._src.kernel import recording
        from kerneltune._src.workflows import tune_workers
        from kerneltune._src.caching import manifest
        from tests.worker_kernels import SteadyKernel
        path = {str(tmp_path / "m.json")!r}
        import subprocess, textwrap
        # Record in a child process: recording runs the kernel, which starts a backend.
        code = textwrap.dedent('''
            import sys; sys.path.insert(0, %r)
            import jax.numpy as jnp, kerneltune as kt
            from kerneltune._src.kernel import recording
            from kerneltune._src.caching import manifest
            from tests.worker_kernels import SteadyKernel
            chain = kt.ConfigSelectorChain(kt.ConfigCache(),
                policy=kt.AutotunePolicy(cache_miss_fallback="heuristics"))
            with recording.record_calls():
                kt.Executor(chain)(SteadyKernel(), jnp.ones((8, 8)))
            manifest.save_manifest(%r)
        ''') % (sys.path[0], path)
        subprocess.run([sys.executable, "-c", code], check=True)
        records = recording.iter_records(manifest.load_manifest(path))
        parts = tune_workers.deal_by_cost(records, 2)
        print(len(records), jax_compat.backends_initialized())
        """
    )
    assert out.split() == ["1", "False"]


def test_the_bundled_kernels_load_on_first_use_of_kt_kernels():
    # `kt.kernels` after a bare `import kerneltune as kt` raised AttributeError.
    out = run_python(
        """
        import sys
        import kerneltune as kt
        print("kerneltune.kernels" in sys.modules)
        print(kt.kernels.softmax.__module__)
        try:
            kt.no_such_name
        except AttributeError as e:
            print(e)
        """
    )
    assert out.splitlines() == [
        "False",
        "kerneltune.kernels.softmax.api",
        "module 'kerneltune' has no attribute 'no_such_name'",
    ]


def test_import_leaves_jax_mosaic_gpu_unloaded_until_a_kernel_is_built():
    # JAX's Mosaic GPU modules take a third of a second to import; only the attention's
    # Mosaic flash kernels need them, and those import them when first built.
    heavy = '("jax.experimental.mosaic.gpu", "jax._src.pallas.mosaic_gpu.core")'
    pallas_loads_it = run_python(
        f"""
        import sys
        import jax.experimental.pallas
        print(any(m in sys.modules for m in {heavy}))
        """
    )
    if pallas_loads_it.split() == ["True"]:
        pytest.skip("this JAX's Pallas imports Mosaic GPU itself (JAX 0.10.0)")
    out = run_python(
        f"""
        import sys
        import kerneltune, kerneltune.kernels
        heavy = {heavy}
        print(*[m in sys.modules for m in heavy])
        from kerneltune.kernels.attention import mosaic_flash
        print(*[m in sys.modules for m in heavy])
        """
    )
    assert out.split() == ["False", "False", "True", "True"]
