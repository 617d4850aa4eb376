"""A config tuned in one process is a persistent cache hit, of the same type, in another."""

import os
import subprocess
import sys
import textwrap

import kerneltune as kt
from tests.helpers import ROOT, CostKernel, RepCfg, events_recorder, rand

SECOND_PROCESS = textwrap.dedent(
    """
    import sys
    import jax
    import kerneltune as kt
    from tests.helpers import CostKernel, RepCfg
    events = []
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), persistent=kt.PersistentCache(sys.argv[1]),
        on_event=lambda e, **d: events.append((e, d.get("level"))),
    )
    cfg = kt.Executor(chain).choose_config(CostKernel(), jax.ShapeDtypeStruct((24, 24), "float32"))
    print(type(cfg).__name__, cfg.reps, events)
    """
)


def test_second_process_gets_a_persistent_hit_of_the_tuned_type(tmp_path):
    events, on_event = events_recorder()
    chain = kt.ConfigSelectorChain(
        kt.ConfigCache(), persistent=kt.PersistentCache(tmp_path), on_event=on_event
    )
    tuned = kt.Executor(chain).choose_config(CostKernel(), rand((24, 24)))
    assert isinstance(tuned, RepCfg) and events[-1][0] == "autotune_finish"
    script = tmp_path / "second.py"
    script.write_text(SECOND_PROCESS)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    # Whichever candidate won here, the other process gets it back, as the same type.
    assert out == f"RepCfg {tuned.reps} [('cache_hit', 'persistent')]"


def test_default_location_without_platformdirs(monkeypatch, tmp_path):
    # The GPU image has no platformdirs: the default location must not need it.
    from kerneltune._src.caching import persistent

    monkeypatch.setitem(sys.modules, "platformdirs", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert persistent.default_cache_dir() == str(tmp_path / "kerneltune")
