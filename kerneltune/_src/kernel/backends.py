"""An op's backends as objects, and the kernel that declares them.

A bundled op runs in several ways: XLA's fusion, a Pallas kernel lowered by Triton or
by Mosaic GPU, a library such as cuDNN or tokamax. Each is a `Backend`: an object that
runs the op with a config, says why it cannot run a call, and (unless JAX
differentiates it) computes the gradient. A `BackendKernel` lists its backends once
(`backends`); the config's `backend` field names the one that runs (`backend_of`).
Every hook of the Kernel contract (`contract.py`) is one method of `BackendKernel`
that asks that object, so a reader follows a call from the executor to the code that
runs on the device without a name built from strings.

The Pallas interpreter is an option of the kernel (`interpret=True`), not another
class: it runs the Pallas backends' code on any device, under the op id
`"<op_id>-interpret"` so its configs never mix with the device's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from kerneltune._src.core import devices, jax_compat
from kerneltune._src.kernel.base import Invocation, Kernel, installed_default_executor
from kerneltune._src.kernel.contract import KernelMethods

Cfg = TypeVar("Cfg")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Pruned(Generic[T]):
    """A candidate left out of the search, and why."""

    cfg: T
    reason: str


# The defaults of `Backend`'s gradient hooks.


def _run_and_no_residuals(
    self: Any, kernel: Any, *args: Any, cfg: Any, **kwargs: Any
) -> tuple[Any, None]:
    return self.run(kernel, *args, cfg=cfg, **kwargs), None


def _no_custom_gradient(self: Any, kernel: Any, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        f"{type(self).__name__} ({kernel.op_id}, backend={self.name!r}) has no custom "
        "gradient; set differentiated_by_jax = True or define vjp."
    )


class Backend:
    """One way to run an op. Subclass it per backend; the op's kernel lists instances
    in `BackendKernel.backends`.

    Attributes:
      name: the value of the config's `backend` field that selects it.
      differentiated_by_jax: True when JAX differentiates `run` itself (XLA, cuDNN,
        tokamax bring their own backward): the kernel's custom gradient is not used.
      lowering: the Pallas lowering its code needs on a device ("triton" or
        "mosaic_gpu"), None for code that needs none. A backend whose lowering this JAX
        lacks cannot run (`unusable` says so), except in the interpreter.
      interprets: True when the Pallas interpreter can run its code (a Mosaic GPU
        kernel cannot be interpreted).
      plain_jax: True when its code is plain JAX (no Pallas, no library): it runs on
        every platform, CPUs and TPUs included.
      backward_tuned_apart: True when its `vjp` runs the same backward whatever its
        config: kernels keyed and tuned for themselves (a grouped matmul's d_lhs and
        d_rhs, the attention backward kernel), fed residuals no config changes. A
        training key times such candidates forward only and adds their backward's time,
        measured once (`selection/training_keys.py`).
    """

    name: ClassVar[str]
    differentiated_by_jax: ClassVar[bool] = False
    lowering: ClassVar[str | None] = None
    interprets: ClassVar[bool] = False
    plain_jax: ClassVar[bool] = False
    backward_tuned_apart: ClassVar[bool] = False

    #: `run(kernel, *args, cfg, **kwargs) -> out`: the op's output for `args` with
    #: `cfg` (each backend takes the op's own arguments, hence the loose type).
    run: Callable[..., Any]
    #: `fwd_with_residuals(kernel, *args, cfg, **kwargs) -> (out, residuals)`: the
    #: forward of the custom gradient; by default `run`'s output and no residuals.
    fwd_with_residuals: Callable[..., Any] = _run_and_no_residuals
    #: `vjp(kernel, residuals, out, dout, *args, cfg, **kwargs) -> cotangents`: the
    #: backward of the custom gradient (a backend JAX differentiates needs none).
    vjp: Callable[..., Any] = _no_custom_gradient

    def unusable(self, kernel: Any, inv: Invocation[Any, Any], cfg: Any) -> str | None:
        """Why this backend cannot run `inv` with `cfg` in this process (None: it can).
        Subclasses add their own reasons (a missing library, an unsupported dtype)."""
        if kernel.use_interpreter():
            if self.lowering is not None and not self.interprets:
                return f"backend={self.name!r} does not run in the Pallas interpreter"
            return None
        if self.lowering is not None:
            return jax_compat.pallas_lowering_missing(self.lowering)
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} backend={self.name!r}>"


class BackendKernel(Kernel[Cfg, Any]):
    """A kernel whose backends are declared objects (every bundled op).

    A subclass sets `backends` (instances, one per value of its config's `backend`
    field) and `fallback` (a plain-JAX backend: what a CPU, a TPU or
    `KERNELTUNE_PLATFORM=xla` runs for a config whose backend is not plain JAX), and
    defines
    `heuristic_cfg`, `search_space` (the device's candidates with the pruned ones) and
    `interpret_candidates` (a few the interpreter runs in reasonable time).

    Args:
      op_id: the op id (default: the class's; `"<op_id>-interpret"` with `interpret`).
      executor: the executor the kernel's own inner calls (its backward kernels) run
        through (default: the default executor).
      interpret: run the Pallas backends in the Pallas interpreter, on any device (for
        tests and the CPU demo: timings measure the interpreter, not a GPU).
    """

    backends: ClassVar[tuple[Backend, ...]] = ()
    fallback: ClassVar[str] = "xla"

    def __init__(
        self,
        op_id: str | None = None,
        *,
        name: str | None = None,
        executor: Any = None,
        interpret: bool = False,
    ) -> None:
        if interpret and op_id is None and name is None:
            op_id = f"{type(self).op_id}-interpret"
        super().__init__(op_id, name=name)
        self.executor = executor
        self.interpret = bool(interpret)

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a lowering worker, `tuning/lowering_pool.py`) runs
        # its inner calls through that process's default executor: an executor holds
        # this process's caches and locks, which neither pickle nor belong there.
        return {**self.__dict__, "executor": None}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = [b.name for b in cls.backends]
        if len(set(names)) != len(names):
            raise TypeError(f"{cls.__qualname__}.backends names a backend twice: {names}")

    # --- which backend runs ----------------------------------------------------------

    def runs_pallas(self) -> bool:
        """True when Pallas backends run: in the interpreter, or on a GPU's platform.
        Elsewhere (CPU, TPU, `KERNELTUNE_PLATFORM=xla`) only plain-JAX backends run, and
        the fallback runs a config of any other."""
        return self.interpret or devices.get_device_platform() == "triton"

    def use_interpreter(self) -> bool:
        """True when Pallas code runs in the interpreter: asked for, or off GPUs."""
        return self.interpret or devices.device_kind() != "gpu"

    def backend_named(self, name: str) -> Backend:
        """The declared backend called `name`."""
        for backend in self.backends:
            if backend.name == name:
                return backend
        raise ValueError(
            f"{self.op_id}: no backend {name!r}; its backends are "
            f"{[b.name for b in self.backends]}."
        )

    def backend_of(self, cfg: Any) -> Backend:
        """The backend that runs `cfg` here: the one its `backend` field names, or the
        fallback where that one is not plain JAX and Pallas does not run, or where this
        JAX lacks the Pallas lowering it needs (JAX 0.12 deprecates Triton's)."""
        named = self.backend_named(self.config_backend(cfg))
        if named.plain_jax or (self.runs_pallas() and not self._lowering_missing(named)):
            return named
        return self.backend_named(self.fallback)

    def _lowering_missing(self, backend: Backend) -> bool:
        if backend.lowering is None or self.use_interpreter():
            return False
        return jax_compat.pallas_lowering_missing(backend.lowering) is not None

    def config_backend(self, cfg: Any) -> str:
        """The name of the backend `cfg` asks for (its `backend` field)."""
        return str(cfg.backend)

    # --- the Kernel contract, each hook asking the config's backend ------------------

    def run(self, *args: Any, cfg: Any, **kwargs: Any) -> Any:
        return self._lowering(cfg).run(self, *args, cfg=cfg, **kwargs)

    def fwd_with_residuals(self, *args: Any, cfg: Any, **kwargs: Any) -> Any:
        return self._lowering(cfg).fwd_with_residuals(self, *args, cfg=cfg, **kwargs)

    def _lowering(self, cfg: Any) -> Backend:
        """`backend_of(cfg)`, about to be traced (JAX lowers it later)."""
        backend = self.backend_of(cfg)
        if backend.lowering == "triton" and not self.use_interpreter():
            jax_compat.show_triton_deprecation_once()
        return backend

    def vjp(self, residuals: Any, out: Any, dout: Any, *args: Any, cfg: Any, **kwargs: Any) -> Any:
        return self.backend_of(cfg).vjp(self, residuals, out, dout, *args, cfg=cfg, **kwargs)

    def differentiated_by_jax(self, cfg: Any) -> bool:
        return self.backend_of(cfg).differentiated_by_jax

    def config_unusable(self, inv: Invocation[Any, Any], cfg: Any) -> str | None:
        try:
            named = self.backend_named(self.config_backend(cfg))
        except ValueError as e:  # a backend this op does not declare
            return str(e)
        if not (named.plain_jax or self.runs_pallas()):
            return None  # the fallback runs every config here
        return named.unusable(self, inv, cfg)

    def heuristic_cfg(self, inv: Invocation[Any, Any]) -> Cfg:
        raise NotImplementedError(f"{type(self).__qualname__} defines no heuristic_cfg")

    def candidate_cfgs(self, inv: Invocation[Any, Any]) -> list[Cfg]:
        """The candidates to tune: the interpreter's few, or the device's search space,
        less what cannot run in this process; none where Pallas does not run (the
        heuristic's plain-JAX backend runs)."""
        if not self.runs_pallas():
            return []
        if self.use_interpreter():
            space = list(self.interpret_candidates(inv))
        else:
            space = self.search_space(inv)[0]
        return without_unusable(space, [], lambda c: self.config_unusable(inv, c))[0]

    def pruned_cfgs(self, inv: Invocation[Any, Any]) -> list[Pruned[Cfg]]:
        """The device's configs left out of the search for this call, each with its
        reason: by the space's rules, or because they cannot run in this process."""
        kept, pruned = self.search_space(inv)
        return without_unusable(kept, list(pruned), lambda c: self.config_unusable(inv, c))[1]

    def search_space(self, inv: Invocation[Any, Any]) -> tuple[list[Cfg], list[Pruned[Cfg]]]:
        """The device's candidates for this call that can fit, and the pruned ones, each
        with its reason."""
        raise NotImplementedError(f"{type(self).__qualname__} defines no search_space")

    def interpret_candidates(self, inv: Invocation[Any, Any]) -> list[Cfg]:
        """A few candidates the Pallas interpreter can run in reasonable time."""
        raise NotImplementedError(f"{type(self).__qualname__} defines no interpret_candidates")

    def padded_work(self, cfg: Any, sizes: Sequence[int]) -> float:
        """The work `cfg` does at a call of `sizes` (`CallShape.sizes`) over the call's
        own: tiles that stick out of the problem are computed whole. The prediction
        scales a tuned call's timing of `cfg` by its ratio here to there. 1.0 (no
        model) unless a kernel knows its tiles."""
        return 1.0

    def config_across_sizes(self, cfg: Any, sizes: Sequence[int]) -> Any:
        """`cfg`, of a call of `sizes`, as it compares with the configs of calls of other
        sizes: a field whose meaning depends on the sizes (a chunk as long as the call:
        one chunk) in terms that hold at any size. The prediction matches a tuned call's
        configs to the candidates here by it. `cfg` itself unless a kernel has such
        fields; `cfg` may be a config or its field dict."""
        return cfg

    def manifest_kwargs(self) -> dict[str, Any]:
        """What another process rebuilds this kernel with (its executor stays here)."""
        out: dict[str, Any] = {}
        if self.interpret:
            out["interpret"] = True
        default = f"{type(self).op_id}-interpret" if self.interpret else type(self).op_id
        if self.op_id != default:
            out["op_id"] = self.op_id
        return out

    @classmethod
    def contract_methods(cls, platform: str, device: str, context: str | None) -> KernelMethods:
        """The kernel's hooks, named here rather than found by their names: the same
        methods on every platform and in every context (each decides by the config)."""
        return KernelMethods(
            platform=platform,
            device=device,
            context=context,
            run=cls.run,
            heuristic_cfg=cls.heuristic_cfg,
            candidates=cls.candidate_cfgs,
            fwd_with_residuals=cls.fwd_with_residuals,
            vjp=cls.vjp,
            custom_vjp=None,
            differentiated_by_jax=cls.differentiated_by_jax,
            reference=getattr(cls, "reference", None),
            tuning_inputs=cls.tuning_inputs,
            config_unusable=cls.config_unusable,
            config_type=getattr(cls, "config_type", None),
        )

    def inner_executor(self) -> Any:
        """The executor for calls the kernel makes itself (e.g. its backward kernels):
        the one it was bound to, else the default executor."""
        if self.executor is not None:
            return self.executor
        return installed_default_executor()


def served_op_ids(cls: type) -> tuple[str, ...]:
    """The op ids a kernel class's instances use: its own, and for a `BackendKernel`
    the interpreted one (`"<op_id>-interpret"`)."""
    own = str(getattr(cls, "op_id", "") or cls.__name__)
    return (own, f"{own}-interpret") if issubclass(cls, BackendKernel) else (own,)


def without_unusable(
    kept: Iterable[T], pruned: list[Pruned[T]], reason_of: Any
) -> tuple[list[T], list[Pruned[T]]]:
    """`kept` split again by `reason_of(cfg)` (a reason, or None when it can run): what
    cannot run in this process (a lowering this JAX lacks, a library not installed) is
    pruned with its reason."""
    usable: list[T] = []
    for cfg in kept:
        reason = reason_of(cfg)
        if reason is None:
            usable.append(cfg)
        else:
            pruned.append(Pruned(cfg, reason))
    return usable, pruned
