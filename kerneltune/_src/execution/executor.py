"""The Executor: prepares a call, chooses its config, and runs the kernel.

Eager calls never run op by op: each (kernel, config, static arguments) gets one jitted
program, and a dispatch table maps the call's signature (shapes, dtypes, static values)
straight to that program, so a repeated eager call costs a tuple build and a dict lookup
on top of the jitted call. The table is dropped whenever the chooser says its choices may
have changed (a cache changed, the policy was replaced), and is keyed by the
context-local scope (overlays, policy overrides).
Under a trace (jit, grad, vmap, shard_map), the kernel is traced inline.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from kerneltune._src.core import labels, options, scope, tracing
from kerneltune._src.core.kernel_types import Cfg, Out
from kerneltune._src.execution import eager_programs, eager_table
from kerneltune._src.execution.eager_programs import CallOptions
from kerneltune._src.kernel import changes, dispatch, recording, sharding
from kerneltune._src.kernel.base import (
    Invocation,
    Kernel,
    key_builder_of,
    keys_training_apart,
    make_invocation,
)

_current_scope = scope._current.get
_K = TypeVar("_K", bound=Kernel[Any, Any])
_aval = operator.attrgetter("aval")


@runtime_checkable
class ConfigChooser(Protocol):
    """Anything that chooses a config for an invocation (e.g. `ConfigSelectorChain`).
    An optional `add_invalidation_listener(callback)` method, calling `callback()`
    whenever its choices may change, lets the executor remember choices for eager
    calls."""

    def choose(self, inv: Invocation[Any, Any], kernel: Kernel[Any, Any]) -> Any: ...


_uids = itertools.count()


#: A call that passed none of the executor's own keyword arguments.
_NO_OPTIONS = CallOptions()


class Executor(Generic[Cfg, Out]):
    """Runs kernels with configs chosen by `chooser`.

    Args:
      chooser: a `ConfigChooser`, usually a `ConfigSelectorChain`.
      stamp_prefix: the prefix of the labels stamped into the HLO.
    """

    def __init__(self, chooser: ConfigChooser, stamp_prefix: str = "kerneltune") -> None:
        if not callable(getattr(chooser, "choose", None)):
            raise TypeError(
                f"chooser must have a choose(inv, kernel) method, got {type(chooser).__qualname__}."
            )
        if not isinstance(stamp_prefix, str) or not stamp_prefix or ":" in stamp_prefix:
            raise ValueError(
                f"stamp_prefix must be a non-empty string without ':', got {stamp_prefix!r}."
            )
        self.chooser = chooser
        self.stamp_prefix = stamp_prefix
        # Eager dispatch table (`eager_table.py`): only kept when the chooser tells us
        # when its choices may change.
        self._table = eager_table.EagerTable()
        self._eager = self._table.entries
        #: Never reused within a process (unlike `id()`): keys of caches held elsewhere.
        self.uid = next(_uids)
        subscribe = getattr(chooser, "add_invalidation_listener", None)
        self._eager_enabled = subscribe is not None and callable(subscribe)
        if subscribe is not None and callable(subscribe):
            subscribe(self._invalidate)
        self._programs: dict[Any, eager_programs.Program] = {}
        self._lock = threading.Lock()

    @property
    def _generation(self) -> int:
        return self._table.generation

    def _invalidate(self) -> None:
        self._table.invalidate()

    # -- the hot path ---------------------------------------------------------------------

    def __call__(
        self,
        kernel: Kernel[Cfg, Out],
        *args: Any,
        cfg: Cfg | None = None,
        stamp: bool = True,
        method: str | None = None,
        mesh: Any = None,
        in_specs: Any = None,
        out_specs: Any = None,
        **kwargs: Any,
    ) -> Out:
        """Runs `kernel(*args, **kwargs)` with the chosen config (or `cfg`)."""
        if (
            cfg is None
            and method is None
            and mesh is None
            and in_specs is None
            and out_specs is None
        ):
            # The hot path, inlined; `eager_table.key_of` builds the same key. Arguments without
            # an aval (Python scalars, NumPy arrays) or unhashable keyword values take
            # the general path. Tracers have avals too: a hit under jit/vmap/grad calls
            # the same jitted program, which is then simply traced inline.
            try:
                program = self._eager[
                    (
                        id(kernel),
                        stamp,
                        _current_scope(),
                        *map(_aval, args),
                        *kwargs.items(),
                        *(map(type, kwargs.values()) if kwargs else ()),
                    )
                ]
            except (KeyError, AttributeError, TypeError):
                program = None
            if program is not None:
                return program(*args)  # outside the try: its errors are the caller's
        call = CallOptions(cfg, stamp, method, mesh, in_specs, out_specs)
        return self._call(kernel, args, kwargs, call)

    # -- everything else ------------------------------------------------------------------

    def _call(
        self,
        kernel: Kernel[Cfg, Out],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: CallOptions,
        own: Callable[[Cfg], Callable[[], Any] | None] | None = None,
    ) -> Out:
        generation = self._generation
        call.check(kernel)
        inv, p_args, p_kwargs = self._invocation(kernel, args, kwargs, call)
        chosen = self.chooser.choose(inv, kernel)
        if options.RECORD.value:
            recording.record_invocation(kernel, inv)
        if tracing.is_tracing((args, kwargs)) or tracing.is_tracing((p_args, p_kwargs)):
            trace = None if own is None else own(chosen)
            if trace is not None:  # the caller runs the chosen config itself
                return self._stamped(inv, chosen, trace)  # type: ignore[no-any-return]
            return self._apply(kernel, inv, chosen, p_args, p_kwargs)

        program = self._program(kernel, chosen, args, kwargs, call)
        out = program(*args, **kwargs)
        # Remember the program for this signature, unless the chooser's state changed
        # while choosing (then the next call chooses again).
        if (
            call.cfg is None
            and call.method is None
            and self._eager_enabled
            and generation == self._generation
        ):
            key = eager_table.key_of(kernel, call.stamp, args, kwargs)
            # (A custom key_builder may read more than shapes and static values.)
            default_keys = key_builder_of(kernel) is None
            if key is not None and default_keys and program.takes_exactly(len(args)):
                entry = self._eager_entry(kernel, program, kwargs, call)
                self._table.remember(kernel, key, entry, generation)
        return out

    def _eager_entry(
        self,
        kernel: Kernel[Cfg, Out],
        program: eager_programs.Program,
        kwargs: dict[str, Any],
        call: CallOptions,
    ) -> Callable[..., Any]:
        """What the hot path calls for a signature. Where the config decides the
        backward, a call under a gradient has a key of its own, so it takes the
        general path instead of this forward program."""
        if not keys_training_apart(kernel):
            return program.dynamic

        # Weakly: the entry must not keep the kernel alive (it leaves with the kernel;
        # a kernel that cannot be weakly referenced is never remembered).
        try:
            kernel_ref: Callable[[], Any] = weakref.ref(kernel)
        except TypeError:
            return program.dynamic

        def forward_only(*args: Any) -> Any:
            if any(map(tracing.is_tracer, args)) and tracing.is_differentiated(args):
                return self._call(kernel_ref(), args, dict(kwargs), call)
            return program.dynamic(*args)

        return forward_only

    def _invocation(
        self,
        kernel: Kernel[Cfg, Out],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: CallOptions = _NO_OPTIONS,
    ) -> tuple[Invocation[Cfg, Out], tuple[Any, ...], dict[str, Any]]:
        """The `Invocation` of a call (with `call`'s options), and its prepared
        arguments."""
        prepared = kernel.prepare(*args, **kwargs)
        if not (
            isinstance(prepared, tuple) and len(prepared) == 2 and isinstance(prepared[1], dict)
        ):
            raise TypeError(
                f"{type(kernel).__name__}.prepare must return (args, kwargs) with kwargs a "
                f"dict, got {type(prepared).__qualname__}."
            )
        p_args, p_kwargs = tuple(prepared[0]), dict(prepared[1])
        inv = make_invocation(kernel, p_args, p_kwargs, **call.invocation_fields())
        return inv, p_args, p_kwargs

    def _apply(
        self,
        kernel: Kernel[Cfg, Out],
        inv: Invocation[Cfg, Out],
        cfg: Cfg,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Out:
        """Traces the kernel with `cfg` (platform dispatch, custom VJP, label)."""
        if inv.method == "shard_map":
            fn = sharding.shard_map_function(kernel, cfg, inv)
        else:
            fn = dispatch.kernel_function(kernel, cfg)
        return self._stamped(inv, cfg, lambda: fn(*args, **kwargs))

    def _stamped(self, inv: Invocation[Any, Any], cfg: Any, trace: Callable[[], Any]) -> Any:
        """`trace()` under the call's label (unless stamping is off)."""
        mode = options.STAMP.value
        if not inv.stamp or mode == "none":
            return trace()
        text = labels.label_text(self.stamp_prefix, inv.op_id_v, inv.call_key, cfg, mode)
        with labels.stamped(text, f"{self.stamp_prefix}.{inv.op_id}"):
            return trace()

    def _program(
        self,
        kernel: Kernel[Cfg, Out],
        cfg: Cfg,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: CallOptions,
    ) -> eager_programs.Program:
        """The jitted program running `kernel` with `cfg` for calls shaped like
        (args, kwargs) with `call`'s options: one per (kernel, config, static
        arguments)."""
        sig = eager_programs.signature(kernel, cfg, args, kwargs, call, options.STAMP.value)
        program = self._programs.get(sig.key)
        if program is None:
            identity = sig.key[0]
            held: Kernel[Cfg, Out] | None = kernel
            ref = None
            if isinstance(identity, (eager_programs.Weak, eager_programs.Same)):
                # Known by identity: the program leaves with the kernel (one made afresh
                # for each call would otherwise stay, compiled program and all).
                self._forget_with(kernel, sig.key)
                if isinstance(identity, eager_programs.Weak):
                    held, ref = None, identity.ref
            else:
                # Shared by value (kernels equal by class and attributes): the program
                # traces a copy, so that changing the kernel it was made for changes
                # nothing here.
                held = copy.copy(kernel)

            def trace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                k = held if ref is None else ref()
                assert k is not None  # its program leaves with a collected kernel
                inner, p_args, p_kwargs = self._invocation(k, args, kwargs, call)
                return self._apply(k, inner, cfg, p_args, p_kwargs)

            program = eager_programs.Program(trace, sig)
            self._programs[sig.key] = program
        return program

    def _forget_with(self, kernel: Kernel[Cfg, Out], key: Any) -> None:
        """Drops the program under `key` when `kernel` is collected, or when one of its
        attributes is set (the program holds them as they were)."""
        forget = functools.partial(_drop_program, weakref.ref(self), key)
        changes.on_change(kernel, forget)
        with contextlib.suppress(TypeError):  # no weak references: kept alive instead
            weakref.finalize(kernel, forget)

    # -- the rest of the public API ----------------------------------------------------------

    def call_traced(
        self,
        kernel: Kernel[Cfg, Out],
        *args: Any,
        own: Callable[[Cfg], Callable[[], Any] | None],
        **kwargs: Any,
    ) -> Any:
        """A call under a trace (jit, grad, vmap) whose caller may run the chosen
        config's computation itself: the config is chosen (tuned if the policy says so),
        recorded and labelled as for `__call__`, then `own(cfg)` is asked for a
        function of no arguments; when it gives one, its result is the call's, else the
        kernel runs as usual.

        An op function uses it where a config is plain JAX on arguments the kernel
        only sees reshaped: `matmul` keys `[..., m, k] @ [k, n]` as the 2-D product
        (so every batch shape shares the tuned configs), but runs XLA's choice on the
        N-D arrays, the program plain JAX compiles (XLA lays out the weight
        gradients of the flattened form differently, 1-2% slower in a block's step).
        """
        if not tracing.is_tracing((args, kwargs)):
            raise ValueError(
                "call_traced is for calls under jit, grad or vmap (tracer arguments); "
                "call the executor itself for concrete arrays."
            )
        return self._call(kernel, args, kwargs, CallOptions(), own=own)

    def kernel_that_runs(self, kernel: _K) -> _K:
        """The kernel a call with `kernel` runs: itself, unless a subclass runs another
        (the demo's runs interpreted twins); ops ask it to choose by what can run."""
        return kernel

    def choose_config(
        self, kernel: Kernel[Cfg, Out], *args: Any, cfg: Cfg | None = None, **kwargs: Any
    ) -> Cfg:
        """The config a call with these arguments would use, without running it (the
        arguments are `__call__`'s: `stamp=`, `method=`, `mesh=` and the specs
        included)."""
        return self.chooser.choose(self.invocation(kernel, *args, cfg=cfg, **kwargs), kernel)

    def invocation(
        self,
        kernel: Kernel[Cfg, Out],
        *args: Any,
        cfg: Cfg | None = None,
        stamp: bool = True,
        method: str | None = None,
        mesh: Any = None,
        in_specs: Any = None,
        out_specs: Any = None,
        **kwargs: Any,
    ) -> Invocation[Cfg, Out]:
        """The `Invocation` a call with these arguments makes (prepared arguments, op
        id, call key), without choosing a config or running anything."""
        call = CallOptions(cfg, stamp, method, mesh, in_specs, out_specs)
        call.check(kernel)
        return self._invocation(kernel, args, kwargs, call)[0]

    def compile(
        self,
        kernel: Kernel[Cfg, Out],
        *example_args: Any,
        cfg: Cfg | None = None,
        stamp: bool = True,
        method: str | None = None,
        mesh: Any = None,
        in_specs: Any = None,
        out_specs: Any = None,
        **example_kwargs: Any,
    ) -> Callable[..., Out]:
        """Chooses the config once from the example arguments and returns a callable
        that always runs with it (keeping prepare, platform dispatch, the custom VJP,
        `stamp=` and `method="shard_map"` with its mesh and specs); it works eagerly
        and under jit/grad/vmap."""
        fixed_options = dict(
            stamp=stamp, method=method, mesh=mesh, in_specs=in_specs, out_specs=out_specs
        )
        chosen = self.choose_config(
            kernel, *example_args, cfg=cfg, **fixed_options, **example_kwargs
        )
        call = CallOptions(cfg=chosen, **fixed_options)

        def compiled(*args: Any, **kwargs: Any) -> Out:
            if kwargs:
                eager_programs.refuse_options(kwargs)
            inv, p_args, p_kwargs = self._invocation(kernel, args, kwargs, call)
            if tracing.is_tracing((args, kwargs)) or tracing.is_tracing((p_args, p_kwargs)):
                return self._apply(kernel, inv, chosen, p_args, p_kwargs)
            program = self._program(kernel, chosen, args, kwargs, call)
            return program(*args, **kwargs)

        compiled.cfg = chosen  # type: ignore[attr-defined]
        return compiled


def _drop_program(executor_ref: Callable[[], Executor[Any, Any] | None], key: Any) -> None:
    executor = executor_ref()
    if executor is not None:
        executor._programs.pop(key, None)
