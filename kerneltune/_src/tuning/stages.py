"""Work running on kerneltune's threads (lowerings, compiles, bounded runs): counted,
so that interpreter exit waits for it, and paused, so that a CUPTI session can run
alone.

Exit: a daemon thread still inside XLA's C++ when the interpreter finalises aborts
the process (SIGABRT), so exit waits for the stages still running, saying so after a
second; Ctrl-C during that wait exits at once with status 130.

Pausing (`others_paused`): a CUPTI session records every kernel the process launches,
and XLA's autotuning inside another thread's compile launches kernels too; a session
spoilt that way runs again with the other threads' stages held.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Iterator

#: Stages running now, by thread (a thread's stages may nest).
_running_by_thread: dict[int, int] = {}
_running_changed = threading.Condition()
_exit_hook_installed = False
#: The thread that asked the other threads' stages to wait (`others_paused`), if any.
_pausing_thread: int | None = None


@contextlib.contextmanager
def exit_waits_for_this() -> Iterator[None]:
    """Counts the enclosed work as a running stage: exit waits for it, and it waits to
    start while another thread holds `others_paused`."""
    _stage_started()
    try:
        yield
    finally:
        _stage_finished()


def _running() -> int:
    """How many stages run now, all threads together (lock held)."""
    return sum(_running_by_thread.values())


def _stage_started() -> None:
    global _exit_hook_installed
    me = threading.get_ident()
    with _running_changed:
        # A stage nested in one this thread runs already is part of that one: holding
        # it up would keep the outer stage (which the pauser waits for) from ending.
        _running_changed.wait_for(lambda: _pausing_thread in (None, me) or me in _running_by_thread)
        _running_by_thread[me] = _running_by_thread.get(me, 0) + 1
        if not _exit_hook_installed:
            atexit.register(wait_for_running_stages)
            _exit_hook_installed = True


def _stage_finished() -> None:
    me = threading.get_ident()
    with _running_changed:
        left = _running_by_thread[me] - 1
        if left:
            _running_by_thread[me] = left
        else:
            del _running_by_thread[me]
        _running_changed.notify_all()


@contextlib.contextmanager
def others_paused(timeout_s: float) -> Iterator[bool]:
    """While inside, no other thread starts a lowering, compile or bounded run, and on
    entry the ones running on other threads are waited for (`timeout_s` at most).

    For a CUPTI session: it records every kernel the process launches, and XLA's
    autotuning inside another thread's compile launches kernels, which spoil the
    session's count. Yields whether the other threads' stages ended in time. The
    calling thread's own stages are never held up (a session may compile)."""
    global _pausing_thread
    me = threading.get_ident()
    with _running_changed:
        # One pauser at a time; a second waits for the first to finish.
        _running_changed.wait_for(lambda: _pausing_thread in (None, me))
        outer, _pausing_thread = _pausing_thread, me
    try:  # from here on, also an interrupt while waiting lets the others go again
        with _running_changed:
            quiet = _running_changed.wait_for(
                lambda: _running_by_thread.keys() <= {me}, timeout=timeout_s
            )
        yield quiet
    finally:
        with _running_changed:
            _pausing_thread = outer
            _running_changed.notify_all()


def wait_for_running_stages(say_after_s: float = 1.0) -> None:
    """Blocks until no lowering or compile runs on a kerneltune thread (called at exit)."""
    try:
        with _running_changed:
            if _running_changed.wait_for(lambda: not _running_by_thread, timeout=say_after_s):
                return
            print(
                f"kerneltune: waiting for {_running()} abandoned compile(s) or run(s) to finish "
                "before exiting (Ctrl-C exits now)",
                file=sys.stderr,
                flush=True,
            )
            _running_changed.wait_for(lambda: not _running_by_thread)
    except KeyboardInterrupt:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing to flush.
                pass
        os._exit(130)
