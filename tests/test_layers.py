"""The package's layers: every module imports only from its own layer or below, and no
imports form a cycle. Every import counts, at module level or inside a function.

A new module must be placed in `LAYERS` (the test says so); docs/architecture.md draws
the same picture.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "kerneltune"

#: Bottom to top. A module may import from its own layer and the layers before it.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "foundation: options, files, keys, devices, labels, the coordination service",
        [
            "_src",
            "_src.call_shapes",
            "_src.codec",
            "_src.configs",
            "_src.coordination",
            "_src.devices",
            "_src.files",
            "_src.jax_compat",
            "_src.kernel_types",
            "_src.keys",
            "_src.labels",
            "_src.options",
            "_src.params",
            "_src.policy",
            "_src.scope",
            "_src.tracing",
            "_src.version",
        ],
    ),
    (
        "tuning engine: compiling, timing and choosing among candidates (no Kernel)",
        ["_src.tuning", "_src.tuning.*", "_src.distributed"],
    ),
    (
        "kernel model: Kernel, dispatch to a platform, recording, sharding",
        [
            "_src.kernel",
            "_src.dispatch",
            "_src.kernel_hooks",
            "_src.recording",
            "_src.sharding",
        ],
    ),
    ("caches and storage", ["_src.caching", "_src.caching.*"]),
    ("selection: the chain of tiers", ["_src.key_tuning", "_src.selection", "_src.tiers"]),
    ("executor, and the default one", ["_src.eager_programs", "_src.executor", "_src.default"]),
    (
        "offline, whole-function, distributed verification, batching, explain",
        [
            "_src.batch",
            "_src.benchmarking",
            "_src.explain",
            "_src.isolation",
            "_src.lowered_configs",
            "_src.offline",
            "_src.outcome_entries",
            "_src.split",
            "_src.tune_function",
            "_src.tune_workers",
            "_src.verify",
        ],
    ),
    ("the bundled kernels", ["kernels", "kernels.*"]),
    (
        "command line, demo and the public package",
        [
            "_src.cli",
            "_src.cli.*",
            "cli",
            "__main__",
            "",
        ],
    ),
]


def module_names() -> dict[str, pathlib.Path]:
    """`{name relative to kerneltune: path}` ("" is the package itself)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def layer_of(name: str) -> int:
    found = []
    for i, (_, patterns) in enumerate(LAYERS):
        for p in patterns:
            if name == p or (p.endswith(".*") and name.startswith(p[:-1])):
                found.append(i)
    if len(found) != 1:
        raise AssertionError(
            f"kerneltune.{name} is in {len(found)} layers of tests/test_layers.py; place it "
            "in exactly one (and in docs/architecture.md)."
        )
    return found[0]


def imports_of(name: str) -> set[str]:
    """The kerneltune modules `name` imports (every import statement, anywhere)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [p for p in package if p]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(["kerneltune", *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # `from package import module` depends on the module; `from module import
            # name` on the module.
            rel = module.removeprefix("kerneltune").removeprefix(".")
            subs = [f"{module}.{a.name}" for a in node.names]
            names = [
                sub if f"{rel}.{a.name}".lstrip(".") in MODULES else module
                for sub, a in zip(subs, node.names, strict=True)
            ]
        else:
            continue
        for full in names:
            if full == "kerneltune" or full.startswith("kerneltune."):
                rel = full.removeprefix("kerneltune").removeprefix(".")
                if rel in MODULES and rel != name:
                    found.add(rel)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_only_its_layer_and_below(name):
    mine = layer_of(name)
    upward = sorted(t for t in GRAPH[name] if layer_of(t) > mine)
    assert not upward, (
        f"kerneltune.{name} (layer {LAYERS[mine][0]!r}) imports from layers above it: "
        + ", ".join(f"{t} ({LAYERS[layer_of(t)][0]!r})" for t in upward)
    )


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def test_the_check_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    # The test must be able to fail: a function-level import of the executor from a
    # foundation module is caught.
    fake = tmp_path / "labels.py"
    fake.write_text("def f():\n    from kerneltune._src.executor import Executor\n")
    monkeypatch.setitem(MODULES, "_src.labels", fake)
    assert "_src.executor" in imports_of("_src.labels")


def test_docs_architecture_describes_the_same_layers():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    described = [line for line in page.splitlines() if line[:1].isdigit() and ". **" in line]
    assert len(described) == len(LAYERS), "docs/architecture.md and LAYERS disagree"


def test_only_jax_compat_reaches_into_jax_private_modules():
    # A JAX release that moves its internals must break one module, not many.
    offenders = []
    for name, path in MODULES.items():
        if name == "_src.jax_compat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = None
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
            elif isinstance(node, ast.Import):
                module = ",".join(a.name for a in node.names)
            if module is not None and "jax._src" in module:
                offenders.append(name)
    assert not offenders, f"private JAX imports outside _src/jax_compat.py: {offenders}"


#: Underscored names read by name that are not JAX's: kerneltune's own marks and
#: namedtuple's public `_asdict`.
OWN_PRIVATE_ATTRIBUTES = {"_kerneltune_observed", "_run", "_asdict"}


def test_only_jax_compat_reads_private_attributes_by_name():
    # `getattr(module, "_private")` reaches into JAX as surely as an import does.
    offenders = []
    for name, path in MODULES.items():
        if name == "_src.jax_compat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and node.args[1].value.startswith("_")
                and not node.args[1].value.startswith("__")
                and node.args[1].value not in OWN_PRIVATE_ATTRIBUTES
            ):
                offenders.append(f"{name}: {node.args[1].value}")
    assert not offenders, f"private attributes read outside _src/jax_compat.py: {offenders}"


def test_the_selection_epoch_can_be_advanced_on_every_supported_jax():
    # JAX 0.10.0's user contexts have no `set_global` (0.10.2 does): calling it directly
    # failed every offline tuning that retired a provisional choice on the oldest JAX.
    import jax

    from kerneltune._src import jax_compat

    context = jax.make_user_context(0)
    jax_compat.set_user_context_global(context, 7)
    assert context.value == 7
