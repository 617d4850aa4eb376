"""The package's layers: one package of `kerneltune/_src/` per layer, and a module's
layer is its package. Every module imports only from its own layer or below, and no
imports form a cycle. Every import counts, at module level or inside a function.

A new package of `_src/` must be placed in `LAYERS` (the test says so);
docs/architecture.md draws the same picture with the same names.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "kerneltune"
SRC = PACKAGE / "_src"

#: Bottom to top: each layer and the packages (or lone modules) it is made of. A module
#: may import from its own layer and the layers before it.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "core: options, files, codec, keys, configs, devices, labels, scopes, coordination",
        ["_src.core", "_src", "_src.version", "_src.params"],
    ),
    ("tuning: compiling, timing and choosing among candidates (no Kernel)", ["_src.tuning"]),
    ("kernel: Kernel, its methods, dispatch, hooks, recording, sharding", ["_src.kernel"]),
    ("caching: caches and storage", ["_src.caching"]),
    ("selection: the policy, the tiers, the chain, tuning one key", ["_src.selection"]),
    ("execution: the executor, eager programs, the default executor", ["_src.execution"]),
    (
        "workflows: offline, whole-function, workers, verification, batching, explain",
        ["_src.workflows"],
    ),
    ("the bundled kernels", ["kernels"]),
    ("cli: the command line, the demo and the public package", ["_src.cli", "cli", "__main__", ""]),
]

#: The modules `_src/` may hold beside its packages.
TOP_LEVEL_MODULES = {"__init__", "version", "params"}


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


def package_of(name: str) -> str:
    """The package that places `name` in a layer: `_src.<package>` for a module of
    `_src/`'s packages, `kernels` for a bundled kernel, else the module itself."""
    parts = name.split(".")
    if parts[0] == "_src" and len(parts) > 1 and (SRC / parts[1]).is_dir():
        return ".".join(parts[:2])
    if parts[0] == "kernels":
        return "kernels"
    return name


def layer_of(name: str) -> int:
    package = package_of(name)
    found = [i for i, (_, packages) in enumerate(LAYERS) if package in packages]
    if len(found) != 1:
        raise AssertionError(
            f"kerneltune.{package} is in {len(found)} layers of tests/test_layers.py; place "
            "it in exactly one (and in docs/architecture.md)."
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


def upward_imports(name: str) -> list[str]:
    """The modules `name` imports from layers above its own."""
    mine = layer_of(name)
    return sorted(t for t in imports_of(name) if layer_of(t) > mine)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_only_its_layer_and_below(name):
    upward = [t for t in GRAPH[name] if layer_of(t) > layer_of(name)]
    assert not upward, (
        f"kerneltune.{name} (layer {LAYERS[layer_of(name)][0]!r}) imports from layers above "
        "it: " + ", ".join(f"{t} ({LAYERS[layer_of(t)][0]!r})" for t in sorted(upward))
    )


LAYER_PACKAGES = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())


def test_src_holds_only_the_layer_packages_and_three_modules():
    # The tree is the architecture: a reader who opens `_src/` sees the layers.
    beside = {p.stem for p in SRC.glob("*.py")} - TOP_LEVEL_MODULES
    assert not beside, f"modules in _src/ beside its packages: {sorted(beside)}"
    listed = [p.removeprefix("_src.") for _, ps in LAYERS for p in ps]
    assert sorted(set(LAYER_PACKAGES) & set(listed)) == LAYER_PACKAGES, (
        f"packages of _src/ missing from LAYERS: {sorted(set(LAYER_PACKAGES) - set(listed))}"
    )


@pytest.mark.parametrize("package", LAYER_PACKAGES)
def test_each_layer_package_says_what_it_owns_and_may_import(package):
    tree = ast.parse((SRC / package / "__init__.py").read_text())
    doc = ast.get_docstring(tree)
    assert doc and "import" in doc, f"_src/{package}/__init__.py: say what the layer may import"
    # Only the docstring: importing a layer's package imports nothing of it.
    assert len(tree.body) == 1, f"_src/{package}/__init__.py holds more than its docstring"


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


def test_the_check_fails_on_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    # The test must be able to fail: a function-level import of the executor from a
    # core module is caught, and so is an import of the selection chain from the
    # kernel layer.
    fake = tmp_path / "labels.py"
    fake.write_text("def f():\n    from kerneltune._src.execution.executor import Executor\n")
    monkeypatch.setitem(MODULES, "_src.core.labels", fake)
    assert upward_imports("_src.core.labels") == ["_src.execution.executor"]
    fake = tmp_path / "dispatch.py"
    fake.write_text("from kerneltune._src.selection import chain\n")
    monkeypatch.setitem(MODULES, "_src.kernel.dispatch", fake)
    assert upward_imports("_src.kernel.dispatch") == ["_src.selection.chain"]


def test_docs_architecture_describes_the_same_layers():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    described = [line for line in page.splitlines() if line[:1].isdigit() and ". **" in line]
    assert len(described) == len(LAYERS), "docs/architecture.md and LAYERS disagree"
    for line, (_, packages) in zip(described, LAYERS, strict=True):
        name = packages[0].removeprefix("_src.")
        assert f"`{name}/`" in line, f"docs/architecture.md: {line!r} should name `{name}/`"


def test_only_jax_compat_reaches_into_jax_private_modules():
    # A JAX release that moves its internals must break one module, not many.
    offenders = []
    for name, path in MODULES.items():
        if name == "_src.core.jax_compat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = None
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
            elif isinstance(node, ast.Import):
                module = ",".join(a.name for a in node.names)
            if module is not None and "jax._src" in module:
                offenders.append(name)
    assert not offenders, f"private JAX imports outside _src/core/jax_compat.py: {offenders}"


#: Underscored names read by name that are not JAX's: kerneltune's own marks and
#: namedtuple's public `_asdict`.
OWN_PRIVATE_ATTRIBUTES = {"_kerneltune_observed", "_run", "_asdict"}


def test_only_jax_compat_reads_private_attributes_by_name():
    # `getattr(module, "_private")` reaches into JAX as surely as an import does.
    offenders = []
    for name, path in MODULES.items():
        if name == "_src.core.jax_compat":
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
    assert not offenders, f"private attributes read outside _src/core/jax_compat.py: {offenders}"


def test_the_selection_epoch_can_be_advanced_on_every_supported_jax():
    # JAX 0.10.0's user contexts have no `set_global` (0.10.2 does): calling it directly
    # failed every offline tuning that retired a provisional choice on the oldest JAX.
    import jax

    from kerneltune._src.core import jax_compat

    context = jax.make_user_context(0)
    jax_compat.set_user_context_global(context, 7)
    assert context.value == 7
