"""A lowering worker process (`lowering_pool.py` starts it): reads requests from stdin,
lowers each candidate's program, exports it and writes it back to stdout.

A request is a pickled `(recipe, cfg, jax_flags)`, the recipe itself the pickle of
`(make_fn, specs, backward)` (made once a search), each message
framed by its length: the program is
`make_fn(cfg)` called on `specs` (the tuning's arguments, arrays as
`ShapeDtypeStruct`s), with its backward when `backward`, under the parent's JAX
flags. The reply is `("ok", serialized export)` or `("error", text)`. The first thing
written is `("ready", jax version, default backend)`. The pipe is this process's own
with its parent (never a file another process wrote), and anything else written to
standard output goes to standard error, so that no stray print breaks the stream.

Selecting a config inside a worker would choose it without the parent's caches and
tunings, so the kernels the program calls choose nothing here: any selection raises
(`refuse_selection`), and the parent lowers that candidate itself.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any, BinaryIO

#: True in a worker process: selection refuses to run there (`refuse_selection`).
_in_worker = False

#: Custom calls that jax.export does not promise to keep stable across releases. The
#: export is loaded by the process that asked for it, with the same jax, at once.
UNSTABLE_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call", "mosaic_gpu", "mosaic_gpu_v2")


class SelectionInWorker(RuntimeError):
    """A kernel called inside a worker's lowering tried to choose a config."""


def in_worker() -> bool:
    return _in_worker


def refuse_selection(what: str) -> None:
    """Raises in a lowering worker: `what` (an op's selection) must run in the parent."""
    if in_worker():
        raise SelectionInWorker(
            f"{what} chooses a config while a lowering worker lowers a candidate; the "
            "tuning process lowers this candidate itself"
        )


def export_program(make_fn: Any, cfg: Any, specs: Any, backward: bool) -> bytes:
    """`make_fn(cfg)` on `specs`, as the tuner lowers it, exported and serialized."""
    import jax

    from kerneltune._src.tuning import programs

    spec_args, spec_kwargs = specs
    arrays, rebuild = programs.split_static(spec_args, spec_kwargs)
    call = programs.calling(make_fn(cfg), rebuild)
    fn = programs.with_backward(call) if backward else call
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in UNSTABLE_TARGETS]
    exported = jax.export.export(jax.jit(fn), disabled_checks=checks)(*arrays)
    return bytes(exported.serialize())


def _answer(request: Any) -> tuple[str, Any]:
    import jax

    recipe, cfg, flags = request
    make_fn, specs, backward = pickle.loads(recipe)
    for name, value in flags.items():
        jax.config.update(name, value)
    try:
        return "ok", export_program(make_fn, cfg, specs, backward)
    except Exception as e:  # the parent lowers it itself, and says why if that fails too
        lines = str(e).strip().splitlines()
        return "error", f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


def send(stream: BinaryIO, message: Any) -> None:
    """Writes one message: its pickle's length (8 bytes), then the pickle."""
    send_bytes(stream, pickle.dumps(message))


def send_bytes(stream: BinaryIO, blob: bytes) -> None:
    """Writes one message already pickled."""
    stream.write(len(blob).to_bytes(8, "little") + blob)
    stream.flush()


def receive_bytes(stream: BinaryIO) -> bytes | None:
    """One message's pickle, None at the end of the stream."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    size = int.from_bytes(head, "little")
    blob = stream.read(size)
    if len(blob) < size:
        return None
    return blob


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answers requests until the parent closes the pipe."""
    import jax

    send(replies, ("ready", jax.__version__, jax.default_backend()))
    while (blob := receive_bytes(requests)) is not None:
        try:
            reply = _answer(pickle.loads(blob))
        except Exception as e:  # a request that does not unpickle here, say
            reply = ("error", f"{type(e).__name__}: {e}"[:400])
        send(replies, reply)


def main() -> None:
    """The worker process's entry (`lowering_pool` runs it with `python -c`)."""
    global _in_worker
    _in_worker = True
    # The replies keep the real standard output; everything else printed goes to
    # standard error.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)
