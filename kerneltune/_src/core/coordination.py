"""Host-side messaging between the processes of a job, through the key-value store of
JAX's distributed runtime (set up by `jax.distributed.initialize`).

`exchange` publishes one value per process under a path and waits until every process
has published; a process that does not arrive in time makes the others raise
`AgreementTimeoutError`, naming what they were waiting for and the missing processes.
Rounds number repeated exchanges on the same topic so a retried call rejoins its round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax

from kerneltune._src.core import jax_compat, options

logger = logging.getLogger("kerneltune")


class AgreementTimeoutError(TimeoutError):
    """Some processes did not reach an agreement point in time.

    Attributes:
      what: what was being agreed on (the op and its shapes, or "verify_agreement").
      missing: the ids of the processes that did not arrive.
      timeout_s: how long this process waited.
    """

    def __init__(
        self, message: str, *, what: str, missing: Sequence[int], timeout_s: float
    ) -> None:
        super().__init__(message)
        self.what = what
        self.missing = tuple(missing)
        self.timeout_s = timeout_s


class AgreementError(RuntimeError):
    """The processes cannot agree, or do not: they tuned different candidate lists, lost
    the coordination service, or hold different configs (`verify_agreement`)."""


# -- who the peers are ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Peers:
    """The processes of this job and the key-value client they share.

    `client` needs `key_value_set(key, value)`, `blocking_key_value_get(key,
    timeout_in_ms)` and `key_value_dir_get(prefix)`, as JAX's `DistributedRuntimeClient`
    has (tests pass an in-process stand-in).
    """

    client: Any
    process_id: int
    num_processes: int


def current_peers() -> Peers | None:
    """The peers of this process, or None when it is the only one.

    Raises:
      AgreementError: JAX reports several processes but its distributed client is not
        available (so the processes could not agree).
    """
    count = jax.process_count()
    if count <= 1:
        return None
    client = _jax_client()
    if client is None:
        raise AgreementError(
            f"jax.process_count() is {count} but JAX's distributed runtime client is not "
            "available, so kerneltune cannot make the processes agree on configs. Call "
            "jax.distributed.initialize() before the first kernel call, or never tune at "
            "run time (KERNELTUNE_AUTOTUNE=error or heuristics, with a shipped cache)."
        )
    return Peers(client=client, process_id=jax.process_index(), num_processes=count)


def _jax_client() -> Any:
    return jax_compat.distributed_client()


# -- rounds: the same key may be agreed on more than once ------------------------------

# Keyed by client and process id too, which changes nothing in a real job (one of each)
# and lets tests run several simulated processes as threads of one. The key holds the
# client itself, not its id(): a new client can never inherit a dead one's rounds.
_rounds: dict[tuple[Any, int, str], int] = {}
_rounds_lock = threading.Lock()


def next_round(peers: Peers, topic: str) -> int:
    with _rounds_lock:
        return _rounds.get((peers.client, peers.process_id, topic), 0)


def finish_round(peers: Peers, topic: str, done: int) -> None:
    # Advanced only after a round completes: a call that timed out and is retried
    # rejoins the same round, where late processes will look for it.
    with _rounds_lock:
        key = (peers.client, peers.process_id, topic)
        _rounds[key] = max(_rounds.get(key, 0), done + 1)


def topic_hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


# -- publishing and gathering ---------------------------------------------------------


#: What every key-value store path starts with, and the version of what is stored.
PROTOCOL_ROOT, PROTOCOL_FORMAT = "kerneltune", 1


def exchange_round(
    peers: Peers, kind: str, *topic: str, value: str, timeout_s: float, what: str
) -> dict[int, str]:
    """One exchange of `kind` about `topic` (e.g. the op and call key being tuned):
    publishes `value`, returns every process's, and numbers the rounds so that the same
    topic can be exchanged again later (a key tuned again after a cache clear)."""
    name = topic_hash(kind, *topic)
    round_ = next_round(peers, name)
    path = f"{PROTOCOL_ROOT}/{kind}/v{PROTOCOL_FORMAT}/{name}/{round_}"
    raw = exchange(peers, path, value, timeout_s=timeout_s, what=what)
    finish_round(peers, name, round_)
    return raw


def exchange(peers: Peers, path: str, value: str, *, timeout_s: float, what: str) -> dict[int, str]:
    """Publishes `value` under `path/<this process>` and returns every process's value.

    If this process already published under `path` (an earlier attempt timed out), the
    stored value is kept and returned for this process: other processes may have read
    it already, and every process must decide from the same data.

    Raises:
      AgreementTimeoutError: some process did not publish within `timeout_s`.
      AgreementError: the coordination service failed (e.g. it went away).
    """
    client, me = peers.client, peers.process_id
    own = f"{path}/{me}"
    try:
        client.key_value_set(own, value)
    except Exception as e:  # the client raises its runtime's errors.
        if "ALREADY_EXISTS" not in str(e).upper():
            raise AgreementError(
                f"process {me} could not publish its results for {what} to JAX's "
                f"coordination service: {e}"
            ) from e
        value = client.blocking_key_value_get(own, 10_000)
    values = {me: value}
    deadline = time.monotonic() + timeout_s
    for pid in range(peers.num_processes):
        if pid == me:
            continue
        remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            values[pid] = client.blocking_key_value_get(f"{path}/{pid}", remaining_ms)
        except Exception as e:  # the client raises its runtime's errors.
            if not _is_deadline(e):
                raise AgreementError(
                    f"process {me} lost contact with JAX's coordination service while "
                    f"waiting for process {pid} to agree on {what}: {e}"
                ) from e
            missing = _missing(client, path, peers)
            raise AgreementTimeoutError(
                _timeout_message(what, missing, peers, timeout_s),
                what=what,
                missing=missing,
                timeout_s=timeout_s,
            ) from None
    return values


def _is_deadline(e: BaseException) -> bool:
    return isinstance(e, TimeoutError) or "DEADLINE_EXCEEDED" in str(e).upper()


def _missing(client: Any, path: str, peers: Peers) -> list[int]:
    arrived: set[int] = {peers.process_id}
    try:
        for name, _ in client.key_value_dir_get(f"{path}/"):
            tail = name.rstrip("/").rsplit("/", 1)[-1]
            if tail.isdigit():
                arrived.add(int(tail))
    except Exception:  # only used to word the error; assume none came.
        logger.debug("could not list %s in the coordination service", path, exc_info=True)
    return [p for p in range(peers.num_processes) if p not in arrived]


def _timeout_message(what: str, missing: Sequence[int], peers: Peers, timeout_s: float) -> str:
    who = ", ".join(str(p) for p in missing) or "(they arrived while this one gave up)"
    return (
        f"kerneltune: process(es) {who} of {peers.num_processes} did not reach the agreement "
        f"on {what} within {timeout_s:g} s (this is process {peers.process_id}). Every "
        "process must make the same kernel calls in the same order; a process that never "
        "gets here crashed, runs different code, or found the config in its own memory or "
        "persistent cache while this one did not (caches that differ between processes: "
        "share one cache or ship the same one, and check with kerneltune.verify_agreement()). "
        "If tuning just takes longer on some processes, raise KERNELTUNE_AGREE_TIMEOUT."
    )


def timeout_seconds(timeout_s: float | None) -> float:
    if timeout_s is None:
        return float(options.AGREE_TIMEOUT.value)
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    return float(timeout_s)


# -- agreeing on a tuning result ------------------------------------------------------
