"""One persistent-cache entry: its JSON document, how it is validated, where it lives.

An entry document is plain JSON: the key, the config's fields, where the config came
from, every candidate's timings and errors, and the versions that wrote it. Reading one
never runs code and never trusts a type name from the file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
from collections.abc import Mapping
from typing import Any, Literal

from kerneltune._src.caching import storage
from kerneltune._src.core.call_shapes import CallShape
from kerneltune._src.core.configs import config_from_dict, config_to_dict
from kerneltune._src.tuning.report import TuningReport
from kerneltune._src.version import __version__

logger = logging.getLogger("kerneltune")

Provenance = Literal["autotuned", "imported", "shipped"]

SCHEMA = 1
#: The strategy of an entry that lists a call with nothing to tune ("untuned: why").
UNTUNED_STRATEGY = "untuned"
ENTRY_KIND = "kerneltune.cache_entry"
PROVENANCES: tuple[str, ...] = ("autotuned", "imported", "shipped")


def check_provenance(provenance: str) -> None:
    """Raises ValueError unless `provenance` is one an entry may have."""
    if provenance not in PROVENANCES:
        raise ValueError(
            f"provenance must be one of {list(PROVENANCES)}, got {provenance!r} "
            "(heuristic configs are never stored as tuned)."
        )


@functools.cache
def runtime_versions() -> dict[str, str]:
    """The versions stored with every entry: kerneltune, jax and jaxlib."""
    import importlib.metadata

    import jax

    try:
        jaxlib_version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib_version = "unknown"
    return {"kerneltune": __version__, "jax": jax.__version__, "jaxlib": jaxlib_version}


def op_dirname(op_id: str) -> str:
    """The folder that holds an op's entries (its name, made safe for a path)."""
    safe = "".join(c if c.isalnum() or c in "._@+-" else "_" for c in op_id)[:80]
    if safe == op_id and safe and safe[0] not in ".-":
        return safe
    return f"{safe.lstrip('.-') or 'op'}-{_digest(op_id)[:8]}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def entry_relpath(dev: str, op_id: str, call_key: str) -> str:
    """Where the entry for a key lives, relative to a cache's entry directory."""
    digest = _digest(json.dumps([dev, op_id, call_key]))[:40]
    return f"{op_dirname(op_id)}/{digest[:2]}/{digest}{storage.ENTRY_SUFFIX}"


def op_matches(op_id: str, pattern: str) -> bool:
    """True when `op_id` ("matmul@v1") is `pattern`, or `pattern` names the op without
    a version ("matmul")."""
    return op_id == pattern or op_id.rpartition("@")[0] == pattern


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tuned call: what an `AutotuningResult` holds and what the persistent cache
    stores (`CacheEntry` is the same type).

    Attributes:
      op_id_v: the op id with its version, `"<op_id>@v<version>"`.
      call_key: the call key.
      cfg: the config: an instance of the kernel's config type, or its fields as plain
        JSON data (as read from a file, before the kernel's type is known).
      timings: every candidate as a dict: `cfg` (its fields), `status` ("ok" or why it
        was dropped), `time_s` (median seconds), `samples_s`, `error`, `compile_s`,
        `rel_error`, `calls_per_sample`.
      signature: the call's shapes, readable ("f32[128,256], causal=True").
      cfg_type: the config class's name (informational: never used to load it).
      timer: the timer that measured the candidates (None when not tuned here).
      best_time_s: the winner's time.
      heuristic_time_s: the heuristic config's time, when it was measured.
      created: when it was tuned (Unix time); on import and merge the newer one wins.
      heuristic_cfg: the config the winner was compared with (its fields, or its repr
        when it is not a dataclass).
      strategy: the search strategy used; "untuned: <why>" for a call listed with
        nothing to tune (its heuristic config; see `untuned`).
      wall_s: how long tuning took.
      shape: the call's sizes and size-free family (`call_shapes.py`): what warm
        start uses to find the tuned neighbours of a new call. None in entries
        written before it was stored.
      budgeted: tuned on the first call under a budget (`FirstCallBudget`): only the
        few configs a prediction ranked best were timed. A lookup that asks for a full
        search treats it as a miss, and the full search's entry replaces it.
      dev: the device fingerprint it was tuned on (where it is stored).
      provenance: "autotuned", "imported" or "shipped".
      versions: kerneltune, jax and jaxlib versions that wrote it.
      path: where the entry is stored.
    """

    op_id_v: str
    call_key: str
    cfg: Any
    timings: tuple[Mapping[str, Any], ...] = ()
    signature: str = ""
    cfg_type: str = ""
    timer: str | None = None
    best_time_s: float | None = None
    heuristic_time_s: float | None = None
    created: float = 0.0
    heuristic_cfg: Any = None
    strategy: str | None = None
    wall_s: float | None = None
    shape: CallShape | None = None
    budgeted: bool = False
    # Where and by whom it is stored: not part of what the entry says about the call.
    dev: str = dataclasses.field(default="", compare=False)
    provenance: str = dataclasses.field(default="autotuned", compare=False)
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    path: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        # Filled in as the file would hold it, so that an entry built by hand compares
        # equal to itself after a round trip through a file.
        if not self.cfg_type and not isinstance(self.cfg, Mapping):
            object.__setattr__(self, "cfg_type", type_name(self.cfg))

    @property
    def op_id(self) -> str:
        """The same as `op_id_v` (the persistent cache's name for it)."""
        return self.op_id_v

    @property
    def candidates(self) -> tuple[Mapping[str, Any], ...]:
        """The same as `timings` (the persistent cache's name for them)."""
        return self.timings

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dev, self.op_id_v, self.call_key)

    @property
    def speedup(self) -> float | None:
        """Heuristic time over the winner's time (>1 means tuning paid off)."""
        if not self.best_time_s or not self.heuristic_time_s:
            return None
        return self.heuristic_time_s / self.best_time_s

    def to_document(self) -> dict[str, Any]:
        """The JSON document stored for this entry (without its path)."""
        return {
            "kind": ENTRY_KIND,
            "schema": SCHEMA,
            "dev": self.dev,
            "op_id": self.op_id_v,
            "call_key": self.call_key,
            "cfg": config_to_dict(self.cfg),
            "provenance": self.provenance,
            "signature": self.signature or None,
            "timer": self.timer,
            "candidates": [plain(dict(t)) for t in self.timings],
            "heuristic_cfg": plain(self.heuristic_cfg),
            "heuristic_time_s": _finite(self.heuristic_time_s),
            "best_time_s": _finite(self.best_time_s),
            "strategy": self.strategy,
            "wall_s": _finite(self.wall_s),
            "shape": None if self.shape is None else self.shape.to_json(),
            "created": self.created,
            "versions": dict(self.versions) or runtime_versions(),
            "cfg_type": self.cfg_type or None,
            # Written only when set: a fully tuned entry reads as it did before budgets.
            **({"budgeted": True} if self.budgeted else {}),
        }

    @property
    def untuned(self) -> bool:
        """True for a call listed with nothing to tune (one candidate, or none): its
        config is the heuristic one, and `strategy` says why. Imports and merges into a
        persistent cache skip such entries, so that a later install that brings more
        candidates (a backend) still tunes the call."""
        return (self.strategy or "").partition(":")[0] == UNTUNED_STRATEGY


CacheEntry = Entry


def plain(value: Any) -> Any:
    """JSON data for timings and configs (configs as their fields, tuples as lists,
    non-finite numbers as null)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class BadEntry(ValueError):
    """A stored document that this version of kerneltune cannot use."""


def _optional(doc: Mapping[str, Any], name: str, types: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if value is not None and not isinstance(value, types):
        raise BadEntry(f"field {name!r} is a {type(value).__name__}")
    return value


def entry_from_document(doc: Any, path: str) -> CacheEntry:
    """Validates a stored document and turns it into a `CacheEntry`.

    Raises:
      BadEntry: the document is not an entry this version of kerneltune can read.
    """
    if not isinstance(doc, dict):
        raise BadEntry(f"expected a JSON object, found a {type(doc).__name__}")
    if doc.get("kind") != ENTRY_KIND:
        raise BadEntry(f"not a kerneltune cache entry (kind={doc.get('kind')!r})")
    schema = doc.get("schema")
    if schema != SCHEMA:
        age = "an older" if isinstance(schema, int) and schema < SCHEMA else "another"
        raise BadEntry(f"written with {age} schema ({schema!r}); this version reads {SCHEMA}")
    for name in ("dev", "op_id", "call_key"):
        if not isinstance(doc.get(name), str):
            raise BadEntry(f"field {name!r} is missing or not a string")
    if not isinstance(doc.get("cfg"), dict):
        raise BadEntry("field 'cfg' is missing or not an object")
    if doc.get("provenance") not in PROVENANCES:
        raise BadEntry(f"unknown provenance {doc.get('provenance')!r}")
    candidates = doc.get("candidates") or []
    if not isinstance(candidates, list) or not all(isinstance(c, dict) for c in candidates):
        raise BadEntry("field 'candidates' is not a list of objects")
    versions = doc.get("versions") or {}
    if not isinstance(versions, dict):
        raise BadEntry("field 'versions' is not an object")
    number = (int, float)
    budgeted = doc.get("budgeted", False)
    if not isinstance(budgeted, bool):
        raise BadEntry("field 'budgeted' is not a bool")
    return Entry(
        doc["op_id"],
        doc["call_key"],
        doc["cfg"],
        dev=doc["dev"],
        provenance=doc["provenance"],
        signature=_optional(doc, "signature", str) or "",
        timer=_optional(doc, "timer", str),
        timings=tuple(candidates),
        heuristic_cfg=_optional(doc, "heuristic_cfg", (dict, str)),
        heuristic_time_s=_optional(doc, "heuristic_time_s", number),
        best_time_s=_optional(doc, "best_time_s", number),
        strategy=_optional(doc, "strategy", str),
        wall_s=_optional(doc, "wall_s", number),
        shape=CallShape.from_json(doc.get("shape")),
        created=float(_optional(doc, "created", number) or 0.0),
        versions={str(k): str(v) for k, v in versions.items()},
        cfg_type=_optional(doc, "cfg_type", str) or "",
        budgeted=budgeted,
        path=path,
    )


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _plain_cfg(cfg: Any) -> Any:
    try:
        return config_to_dict(cfg)
    except TypeError:
        return repr(cfg)


def report_fields(report: TuningReport | None) -> dict[str, Any]:
    """The `Entry` fields that come from a tuning report, as JSON data."""
    if report is None:
        return {}
    candidates = [
        {
            "cfg": _plain_cfg(c.cfg),
            "status": c.status,
            "time_s": _finite(c.time_s),
            "samples_s": [s for s in map(_finite, c.samples_s) if s is not None],
            "error": None if c.error is None else str(c.error),
            "compile_s": _finite(c.compile_s),
            "rel_error": _finite(getattr(c, "rel_error", None)),
            "calls_per_sample": getattr(c, "calls_per_sample", None),
        }
        for c in report.candidates
    ]
    return {
        "timer": report.timer,
        "timings": tuple(candidates),
        "heuristic_cfg": None if report.heuristic_cfg is None else _plain_cfg(report.heuristic_cfg),
        "heuristic_time_s": _finite(report.heuristic_time_s),
        "best_time_s": _finite(report.best_time_s),
        "strategy": report.strategy,
        "wall_s": _finite(report.wall_s),
        "budgeted": bool(getattr(report, "budgeted", False)),
    }


def type_name(cfg: Any) -> str:
    t = type(cfg)
    return f"{t.__module__}.{t.__qualname__}"


def relpath_of_document(doc: Any) -> str | None:
    """Where a (not yet validated) entry document belongs, or None without a key."""
    if not isinstance(doc, dict):
        return None
    dev, op_id, call_key = (doc.get(name) for name in ("dev", "op_id", "call_key"))
    if not (isinstance(dev, str) and isinstance(op_id, str) and isinstance(call_key, str)):
        return None
    return entry_relpath(dev, op_id, call_key)


def round_trips(cfg: Any, fields: dict[str, Any], op_id: str) -> bool:
    """True when `cfg` comes back equal from JSON; else False, with a warning."""
    try:
        text = json.dumps(fields, allow_nan=False)
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            ok = config_from_dict(json.loads(text), type(cfg)) == cfg
        else:
            ok = json.loads(text) == fields
        why = "it comes back different"
    except Exception as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        logger.warning(
            "Not persisting the config %r of %s: it does not survive a JSON round trip "
            "(%s). Config fields should be numbers, strings, bools, None, tuples, enums "
            "or nested dataclasses.",
            cfg,
            op_id,
            why,
        )
    return ok
