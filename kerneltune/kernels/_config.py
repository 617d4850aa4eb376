"""The backend-tagged config every bundled op with several backends uses.

A config names the backend that runs it (`backend`) and carries only that backend's
fields: the others stay None, so two configs that run the same code are equal (and
hash, serialise and search as one). Each subclass declares, once, which fields each
backend takes and what None becomes for it (`backend_fields`); this class checks the
backend, refuses another backend's fields, fills the defaults in where the config is
built, and shows the chosen backend's fields alone.

Block fields are named the same in every op: `block_m`, `block_n`, `block_k` for a
tile of the output's rows, the output's columns and the contracted axis (the loss
head's vocabulary tile is `block_v`). Attention's `FwdParams` and `BwdParams` keep the
seeds' `q_blocksize` and `kv_blocksize`. A config whose fields were renamed lists the
old names in `renamed_fields`, so that stored configs (caches, manifests, the shipped
tables) still load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from kerneltune._src.params import check_one_of

#: The block fields' names in configs stored before they took one name across ops
#: (2026-11-26): a config whose fields were renamed so maps them in `renamed_fields`.
OLD_BLOCK_NAMES: Mapping[str, str] = {"bm": "block_m", "bn": "block_n", "bk": "block_k"}


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class BackendConfig:
    """Base of a frozen dataclass config with a `backend` field (declared by the
    subclass, with its default).

    Class attributes:
      backend_fields: each backend's own fields, with the value None becomes for it
        (None: stays None); a library backend takes none. Its order is the order
        backends are listed in messages.
      shared_fields: fields every backend has (shown first).
      renamed_fields: `{old name: new name}` for configs stored before a rename.
    """

    backend_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    shared_fields: ClassVar[tuple[str, ...]] = ()
    renamed_fields: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        owner = type(self).__name__
        backend = getattr(self, "backend")  # noqa: B009 - declared by the subclass
        check_one_of(owner, "backend", backend, tuple(self.backend_fields))
        self._refuse_other_backends_fields(owner, backend)
        for name, default in self.backend_fields[backend].items():
            if getattr(self, name) is None and default is not None:
                object.__setattr__(self, name, default)  # frozen: filled where built
        self.check()

    def check(self) -> None:
        """The subclass's own checks, once the backend's defaults are filled in."""

    def _refuse_other_backends_fields(self, owner: str, backend: str) -> None:
        taken = self.backend_fields[backend]
        for name in dict.fromkeys(n for names in self.backend_fields.values() for n in names):
            value = getattr(self, name)
            if value is None or name in taken:
                continue
            owners = [b for b, names in self.backend_fields.items() if name in names]
            if len(owners) == 1:
                raise ValueError(
                    f"{owner}.{name} is a field of backend={owners[0]!r}; leave it None with "
                    f"backend={backend!r} (got {value!r})."
                )
            raise ValueError(
                f"{owner}.{name} is not a field of backend={backend!r} (got {value!r}); "
                "leave it None."
            )

    def __repr__(self) -> str:
        backend = getattr(self, "backend")  # noqa: B009
        default = type(self).__dataclass_fields__["backend"].default
        shown = [] if backend == default else [f"backend={backend!r}"]
        names = [*self.shared_fields, *self.backend_fields[backend]]
        shown += [f"{name}={getattr(self, name)!r}" for name in names]
        return f"{type(self).__name__}({', '.join(shown)})"
