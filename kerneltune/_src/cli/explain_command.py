"""`kerneltune explain`: the answer `kt.explain` gives, from the command line.

Two forms:
- `kerneltune explain OP ARG... [--kw NAME=VALUE]`: a call of a kernel, its arrays
  written as signatures show them (`bf16[2,1024,8,64]`); the config that call would get
  here, from which tier, why the tiers before it missed, and the stored timings when it
  came from the persistent cache. Nothing is benchmarked unless `--tune` is given.
- `kerneltune explain KEY [--op OP]`: a call key (or its first characters) from
  `kerneltune cache ls`: the stored entry and its timings.

Importing this module is cheap (the `kerneltune` command's parser imports it).
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from kerneltune._src.cli.errors import CommandError
from kerneltune._src.cli.tune_command import add_import_argument

_ARRAY = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\[([0-9, ]*)\]$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Which config a call gets and why: give an op and its arguments "
        "(`kerneltune explain matmul f32[512,1024] f32[1024,256]`; arrays as signatures "
        "show them, other arguments as JSON), or a call key from `kerneltune cache ls`."
    )
    parser.add_argument("target", help="an op id (e.g. matmul, attention) or a call key")
    parser.add_argument("arguments", nargs="*", metavar="ARG", help="the op's positional arguments")
    parser.set_defaults(trailing_words_join="arguments")  # ARGs may also follow options (see main)
    parser.add_argument(
        "--kw",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a keyword argument of the op (VALUE as JSON, else a string); repeat",
    )
    parser.add_argument("--op", help="with a call key: only this op (e.g. matmul@v3)")
    parser.add_argument(
        "--tune", action="store_true", help="benchmark the call now if no cache has it"
    )
    add_import_argument(parser, "then their op ids can be named")


def run(args: argparse.Namespace) -> int:
    from kerneltune._src.cli import tune_command

    tune_command._import_kernels(args.imports)
    found = _kernel_class(args.target)
    if found is None:
        if args.arguments or args.kw:
            raise CommandError(
                f"no kernel has the op id {args.target!r} (bundled: {_bundled_ops()}; "
                "import your own with --import MODULE)."
            )
        return _explain_key(args)
    return _explain_call(args, *found)


def _explain_call(args: argparse.Namespace, kernel_cls: type, init: dict[str, Any]) -> int:
    from kerneltune._src.cli import tune_command
    from kerneltune._src.execution.executor import Executor
    from kerneltune._src.selection.chain import policy_override
    from kerneltune._src.workflows.explain import explain

    call_args = [parse_argument(a) for a in args.arguments]
    kwargs = dict(parse_keyword(k) for k in args.kw)
    chain = tune_command._selector(args)
    try:
        kernel = kernel_cls(**init)
    except TypeError as e:
        raise CommandError(f"cannot build {kernel_cls.__qualname__}(): {e}") from None
    _check_arguments(args.target, kernel, call_args, kwargs)
    with policy_override(chain, allow_autotune=bool(args.tune)):
        try:
            found = explain(kernel, *call_args, executor=Executor(chain), **kwargs)
        except (TypeError, ValueError) as e:
            raise CommandError(f"{args.target}: {e}") from None
    print(found)
    if not args.tune and any(why == "not allowed by the policy" for _, why in found.misses):
        print("  (pass --tune to benchmark this call now)")
    return 0


def _check_arguments(
    target: str, kernel: Any, call_args: list[Any], kwargs: dict[str, Any]
) -> None:
    """One line naming what the kernel takes when the arguments cannot be bound to its
    `prepare` (the kernel's names, which are not always its public function's)."""
    import inspect

    try:
        sig = inspect.signature(kernel.prepare)
    except (TypeError, ValueError):  # no signature: the kernel's own errors will do
        return
    try:
        sig.bind(*call_args, **kwargs)
    except TypeError as e:
        raise CommandError(
            f"{target}: {e}; the {kernel.op_id} kernel takes {_plain(sig)}."
        ) from None


def _plain(sig: Any) -> str:
    """`sig` without annotations, callable defaults by name (no memory addresses)."""
    import inspect

    def plain(p: inspect.Parameter) -> inspect.Parameter:
        default = p.default
        if callable(default) and not isinstance(default, type):
            default = _Named(getattr(default, "__name__", type(default).__name__))
        return p.replace(annotation=inspect.Parameter.empty, default=default)

    params = [plain(p) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


class _Named:
    """A default value shown by its name."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _explain_key(args: argparse.Namespace) -> int:
    from kerneltune._src.cli.cache_commands import _entries, _open
    from kerneltune._src.workflows.explain import stored_timings

    cache = _open(args)
    found = [e for e in _entries(cache, args.op) if e.call_key.startswith(args.target)]
    if not found:
        raise CommandError(
            f"{args.target!r} is neither an op id (bundled: {_bundled_ops()}) nor the start "
            "of a call key in the persistent cache (see `kerneltune cache ls`)."
        )
    for i, e in enumerate(found):
        if i:
            print()
        print(f"{e.op_id_v}({e.signature or '?'}) on {e.dev}")
        print(f"  call key: {e.call_key}")
        print(f"  config:   {e.cfg}")
        print("  from:     the persistent cache")
        print("\n".join(stored_timings(e)))
    return 0


def parse_argument(text: str) -> Any:
    """`bf16[2,128]` → a `jax.ShapeDtypeStruct`; anything else → its JSON value, or
    the text itself."""
    import jax
    import jax.numpy as jnp

    from kerneltune._src.core.keys import SHORT_DTYPE_NAMES

    m = _ARRAY.match(text.strip())
    if m is None:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    name, dims = m.group(1), m.group(2)
    long_names = {short: long for long, short in SHORT_DTYPE_NAMES.items()}
    try:
        dtype = jnp.dtype(long_names.get(name, name))
    except TypeError:
        raise CommandError(
            f"argument {text!r}: unknown dtype {name!r} (e.g. f32, bf16, f16, i32, int8)."
        ) from None
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(shape, dtype)


def parse_keyword(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise CommandError(f"--kw {text!r}: expected NAME=VALUE, e.g. --kw causal=true.")
    return name, parse_argument(value)


def _kernel_class(op: str) -> tuple[type, dict[str, Any]] | None:
    """The kernel class with this op id and what to build it with; an op id ending in
    "-interpret" names a bundled kernel run by the Pallas interpreter."""
    from kerneltune._src.kernel.backends import served_op_ids
    from kerneltune._src.kernel.base import registered_kernels

    op_id = op.partition("@")[0]
    matches = {c for c in registered_kernels().values() if op_id in served_op_ids(c)}
    own = {c for c in matches if c.op_id == op_id}
    init: dict[str, Any] = {} if own else {"interpret": True}
    matches = own or matches
    if len(matches) > 1:
        names = ", ".join(sorted(f"{c.__module__}:{c.__qualname__}" for c in matches))
        raise CommandError(f"several kernel classes have the op id {op_id!r}: {names}.")
    return None if not matches else (next(iter(matches)), init)


def _bundled_ops() -> str:
    from kerneltune._src.kernel.base import registered_kernels

    ops = {c.op_id for n, c in registered_kernels().items() if n.startswith("kerneltune.")}
    return ", ".join(sorted(o for o in ops if o))
