"""`Kernel` (what a kernel author subclasses) and `Invocation` (one call's context)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, get_args

from kerneltune._src.core import call_shapes, devices, keys, tracing
from kerneltune._src.core.kernel_types import Cfg, Out
from kerneltune._src.kernel import changes


class Kernel(Generic[Cfg, Out]):
    """Base class for a tunable kernel.

    A subclass defines `run(*args, cfg, **kwargs)` (or platform variants such as
    `run_triton`, `run_xla`, `run_cpu`), `heuristic_cfg(inv)`, and optionally
    `candidate_cfgs(inv)` (or `config_space(inv)`), `prepare`, `tuning_inputs`, and a
    custom gradient: `fwd_with_residuals` + `vjp`, or the short `custom_vjp`.

    Attributes:
      op_id: the operation's name; part of every cache key.
      version: bump it when the kernel's code changes so old tuned configs are not
        reused; part of every cache key as `"<op_id>@v<version>"`.
      key_builder: optional `Callable[[Invocation], str]` replacing the default call key
        (written as a method, `def key_builder(self, inv)`, it gets the kernel too).
      config_type: the config dataclass; by default the type `heuristic_cfg` returns
        (for a kernel without a heuristic, the type its candidates share).
      shard_map_check_vma: run `method="shard_map"` calls with JAX's varying-axes check
        (`jax.shard_map(..., check_vma=True)`). Off by default: a Pallas call carries no
        varying-axes information, so the check rejects every Pallas kernel; turn it on
        for a kernel written in plain JAX to have JAX verify its `out_specs`.
      tunes_training_apart: a call under a gradient (`jax.grad`, `jax.vjp`, ...) gets
        a key and a config of its own, tuned on forward + backward time. For kernels
        whose config picks an implementation that brings its own backward (a library
        JAX differentiates), when the fastest forward can have a slow backward. A
        custom `key_builder` makes the key itself: it reads `inv.differentiated`.

    Example:
      >>> import dataclasses, jax.numpy as jnp, kerneltune
      >>> @dataclasses.dataclass(frozen=True)
      ... class Cfg:
      ...     block: int = 8
      >>> class Scale(kerneltune.Kernel):
      ...     op_id = "scale"
      ...     def run(self, x, *, cfg, factor=2.0):
      ...         return x * factor
      ...     def heuristic_cfg(self, inv):
      ...         return Cfg()
      >>> ex = kerneltune.Executor(kerneltune.ConfigSelectorChain(kerneltune.ConfigCache()))
      >>> ex(Scale(), jnp.ones(3), factor=3.0).tolist()
      [3.0, 3.0, 3.0]
    """

    op_id: ClassVar[str] = ""
    version: ClassVar[str] = "0"
    key_builder: ClassVar[Callable[[Invocation], str] | None] = None
    config_type: ClassVar[type | None] = None
    shard_map_check_vma: ClassVar[bool] = False
    tunes_training_apart: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_reserved_names(cls)
        if ":" in str(cls.version):
            # Labels stamped in the HLO separate their parts with ':'.
            raise ValueError(
                f"{cls.__qualname__}.version must not contain ':', got {cls.version!r}."
            )
        _register(cls)

    def __init__(self, op_id: str | None = None, *, name: str | None = None) -> None:
        if op_id is not None and name is not None and op_id != name:
            raise ValueError(
                f"Kernel got op_id={op_id!r} and name={name!r}; they are the same thing, "
                "pass one of them."
            )
        chosen = op_id or name or type(self).op_id or type(self).__name__
        if not isinstance(chosen, str) or not chosen or "@" in chosen or "|" in chosen:
            raise ValueError(
                f"Kernel op_id must be a non-empty string without '@' or '|', got {chosen!r}."
            )
        # Instance attribute shadows the class default.
        self.op_id = chosen  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if changes.watched(self):
            # Programs built from this kernel hold the old value: drop them.
            changes.changed(self)

    @property
    def op_id_v(self) -> str:
        """The op id with the version, as used in cache keys: `"<op_id>@v<version>"`."""
        return f"{self.op_id}@v{self.version}"

    def prepare(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Normalises arguments before config selection; the default changes nothing."""
        return args, kwargs

    def tuning_inputs(self, inv: Invocation[Cfg, Out]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Concrete inputs to benchmark with when the call is being traced.

        Default: seeded random normal data for floating arrays, zeros for integer and
        boolean arrays, static values unchanged. Override it when the kernel needs
        structured inputs (e.g. valid indices or a positive-definite matrix).
        """
        from kerneltune._src.tuning.inputs import random_like

        seed = keys.seed_of(inv.call_key)
        args, kwargs = random_like((tuple(inv.args), dict(inv.kwargs)), seed=seed)
        return tuple(args), dict(kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Out:
        """Runs the kernel through the default executor."""
        get = _default_executor
        if get is None:  # `import kerneltune` installs it (kerneltune/_src/execution/default.py)
            raise RuntimeError("no default executor is installed: import kerneltune first.")
        return get()(self, *args, **kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(op_id={self.op_id!r}, version={self.version!r})"


#: The default executor's getter, installed by the module that builds it (which sits
#: above this one: it needs the executor and the selection chain).
_default_executor: Callable[[], Any] | None = None


def installed_default_executor() -> Any:
    """The default executor (what `Kernel.__call__` runs through)."""
    if _default_executor is None:
        raise RuntimeError("no default executor is installed: import kerneltune first.")
    return _default_executor()


def install_default_executor(get: Callable[[], Any]) -> None:
    """Makes `Kernel.__call__` run through `get()`."""
    global _default_executor
    _default_executor = get


# --- what a kernel class may not do, and where defined kernels are found ------------------

# The executor's own keyword arguments (`executor(kernel, *args, cfg=..., mesh=...)`): a
# kernel argument of the same name would be taken by the executor, silently.
EXECUTOR_OPTIONS = ("cfg", "stamp", "method", "mesh", "in_specs", "out_specs")


#: The hooks that receive a call's keyword arguments (with their platform and context
#: suffixes), and of those the ones that also receive the config as `cfg`.
_TAKE_CALL_KWARGS = ("run", "prepare", "fwd_with_residuals", "vjp", "reference")
_TAKE_CFG = ("run", "fwd_with_residuals", "vjp")


#: The suffixes of a hook's platform and context variants (`run_triton`, `run_cpu`,
#: `run_shard_map`, `run_shard_map_xla`, ...). A method with another suffix
#: (`run_blocks`) is the kernel's own helper, not a hook.
_PLATFORMS = (*get_args(devices.Backend), *get_args(devices.DeviceKind))
_VARIANT_SUFFIXES = frozenset([*_PLATFORMS, "shard_map", *(f"shard_map_{p}" for p in _PLATFORMS)])


def _hook_of(attr: str, hooks: tuple[str, ...]) -> bool:
    return any(
        attr == h or (attr.startswith(h + "_") and attr[len(h) + 1 :] in _VARIANT_SUFFIXES)
        for h in hooks
    )


def _check_reserved_names(cls: type) -> None:
    for attr, fn in vars(cls).items():
        if not _hook_of(attr, _TAKE_CALL_KWARGS):
            continue
        fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
        if not callable(fn):
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        # `run(..., *, cfg)` receives the config: that `cfg` is the kernel's own.
        gets_cfg = _hook_of(attr, _TAKE_CFG)
        taken = [p for p in params if p in EXECUTOR_OPTIONS and not (gets_cfg and p == "cfg")]
        if taken:
            raise TypeError(
                f"{cls.__qualname__}.{attr} has a parameter named {taken[0]!r}, which is "
                f"one of the executor's own options {list(EXECUTOR_OPTIONS)}: a call "
                f"would hand it to the executor, not to the kernel. Rename the parameter "
                f"(e.g. {taken[0]!r} -> {taken[0] + '_'!r})."
            )


_registry: dict[str, type[Kernel[Any, Any]]] = {}


def _register(cls: type[Kernel[Any, Any]]) -> None:
    # A class defined inside a function has no name another process could give; it
    # is still found by its op id.
    _registry[f"{cls.__module__}:{cls.__qualname__}"] = cls


def registered_kernels() -> dict[str, type[Kernel[Any, Any]]]:
    """Every `Kernel` subclass defined so far in this process, by `"module:qualname"`.

    Kernels register when their class is defined; nothing is imported to find one.
    """
    return dict(_registry)


def find_kernel_class(target: str) -> type[Kernel[Any, Any]]:
    """The kernel class registered as `target` ("module:qualname").

    Raises:
      LookupError: no class defined in this process has that name; the message says
        to import the module that defines it (`kerneltune tune --import MODULE`).
    """
    cls = _registry.get(target)
    if cls is not None:
        return cls
    module = target.partition(":")[0] or "the module that defines it"
    raise LookupError(
        f"no kernel class {target!r} is defined in this process. Kernels are never "
        f"imported by a name found in a file: import it first (on the command line: "
        f"kerneltune tune --import {module} ...)."
    )


def _resolved_version(kernel: Kernel[Any, Any]) -> str:
    return str(kernel.version)


@dataclasses.dataclass(frozen=True, eq=False)
class Invocation(Generic[Cfg, Out]):
    """Everything about one kernel call that config selection needs.

    `args`/`kwargs` are the prepared arguments (arrays, tracers or static values);
    the call key is built from their abstract values (shapes, dtypes) and static values,
    never from array contents.
    """

    op_id: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    batch_axes: Any = None
    override_cfg: Cfg | None = None
    stamp: bool = True
    method: str | None = None
    mesh: Any = None
    in_specs: Any = None
    out_specs: Any = None
    version: str = "0"
    key_builder: Callable[[Invocation[Any, Any]], str] | None = None
    #: True when the call is being differentiated and its kernel `tunes_training_apart`:
    #: such calls have keys and configs of their own, tuned for forward + backward.
    #: None otherwise (keys as before).
    differentiated: bool | None = None

    @property
    def op_id_v(self) -> str:
        return f"{self.op_id}@v{self.version}"

    @functools.cached_property
    def abstract_args(self) -> tuple[Any, ...]:
        return tuple(keys.abstractify(tuple(self.args)))

    @functools.cached_property
    def abstract_kwargs(self) -> dict[str, Any]:
        return dict(keys.abstractify(dict(self.kwargs)))

    @property
    def device_fingerprint(self) -> str:
        return devices.device_fingerprint()

    @functools.cached_property
    def call_key(self) -> str:
        return self.make_key(self.key_builder)

    @functools.cached_property
    def signature(self) -> str:
        """Human-readable shapes and static values, e.g. `f32[128,256], causal=True`;
        a training call (see `differentiated`) ends in " (training)"."""
        text = keys.describe_abstract((self.abstract_args, self.abstract_kwargs))
        return f"{text} (training)" if self.differentiated else text

    def key_payload(self) -> dict[str, Any]:
        """What the default call key is a hash of."""
        return keys.key_payload(self.abstract_args, self.abstract_kwargs, **keys.key_fields(self))

    @functools.cached_property
    def shape(self) -> call_shapes.CallShape | None:
        """The call's sizes and the family of calls that differ only in sizes (None when
        its payload has symbolic dimensions or values the codec cannot hold)."""
        return call_shapes.call_shape(self.key_payload())

    def make_key(self, key_builder: Callable[[Invocation[Any, Any]], str] | None = None) -> str:
        """The call key: `key_builder(self)` when given, else a hash of the abstract
        arguments, static values, batch axes, method, mesh and specs."""
        if key_builder is not None:
            key = key_builder(self)
            if not isinstance(key, str) or not key:
                raise TypeError(
                    f"key_builder must return a non-empty str, got {key!r} from {key_builder!r}."
                )
            return key
        return keys.hash_text(keys.stable_json(self.key_payload()))


def default_key_builder_with_sharding(inv: Invocation[Any, Any]) -> str:
    """A key builder that adds every array argument's sharding to the default key, so
    the same shapes sharded differently get their own configs."""
    leaves = [x for x in _array_leaves((inv.args, dict(inv.kwargs)))]
    shardings = [keys.sharding_fingerprint(x) for x in leaves]
    return keys.hash_text(keys.stable_json({**inv.key_payload(), "shardings": shardings}))


def _array_leaves(tree: Any) -> Iterable[Any]:
    import jax

    return (x for x in jax.tree_util.tree_leaves(tree) if keys.is_array(x))


def key_builder_of(kernel: Kernel[Any, Any]) -> Callable[[Invocation[Any, Any]], str] | None:
    # A key builder set on the class is a plain function of the invocation (or a
    # staticmethod), not a method: read it without binding it to the kernel. One
    # written like the other hooks, `def key_builder(self, inv)`, is a method: bound.
    if "key_builder" in vars(kernel):
        return vars(kernel)["key_builder"]  # type: ignore[no-any-return]
    builder = inspect.getattr_static(type(kernel), "key_builder", None)
    if isinstance(builder, staticmethod):
        builder = builder.__func__
    elif inspect.isfunction(builder) and _required_positionals(builder) == 2:
        builder = builder.__get__(kernel, type(kernel))
    return builder  # type: ignore[no-any-return]


def _required_positionals(fn: Callable[..., Any]) -> int:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(fn).parameters.values()
    return sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in params)


def keys_training_apart(kernel: Kernel[Any, Any]) -> bool:
    """Whether calls to `kernel` under a gradient are keyed and tuned apart (its
    `tunes_training_apart`)."""
    return bool(type(kernel).tunes_training_apart)


def make_invocation(
    kernel: Kernel[Any, Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    **fields: Any,
) -> Invocation[Any, Any]:
    """The Invocation of `kernel` for already prepared `args`/`kwargs`; a call being
    differentiated is marked when the kernel's config decides its backward."""
    if "differentiated" not in fields and keys_training_apart(kernel):
        if tracing.is_differentiated((args, kwargs)):
            fields["differentiated"] = True
    return Invocation(
        op_id=kernel.op_id,
        args=tuple(args),
        kwargs=dict(kwargs),
        version=_resolved_version(kernel),
        key_builder=key_builder_of(kernel),
        **fields,
    )
