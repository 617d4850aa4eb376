"""Which keys a multi-process job's processes tune together (`split.seeds_of`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax

from kerneltune._src.workflows import split


@dataclasses.dataclass(frozen=True)
class FakeRecord:
    op_id_v: str
    call_key: str
    rows: int
    family: str | None = "f"

    @property
    def key(self):
        return (self.op_id_v, self.call_key)

    @property
    def args(self):
        return (jax.ShapeDtypeStruct((self.rows, 64), "float32"),)

    @property
    def shape(self):
        return None if self.family is None else SimpleNamespace(family=self.family)


def test_each_familys_costliest_call_is_its_seed_in_key_order():
    records = [
        FakeRecord("matmul@v3", "k1", 512),
        FakeRecord("matmul@v3", "k2", 4096),  # the dearest matmul
        FakeRecord("matmul@v3", "k3", 1024),
        FakeRecord("norm@v1", "k0", 64),
        FakeRecord("norm@v1", "k5", 64),  # a tie: the smaller key
    ]
    assert [r.call_key for r in split.seeds_of(records)] == ["k2", "k0"]


def test_a_family_of_one_key_is_dealt_whole_not_shared():
    # Its one cold search is needed anyway; shared, each process would repeat its fixed
    # work. Another dtype, or an unknown shape, makes a family of its own.
    records = [
        FakeRecord("matmul@v3", "k1", 512),
        FakeRecord("matmul@v3", "k4", 8192, family="g"),
        FakeRecord("op@v1", "a", 8, family=None),
        FakeRecord("op@v1", "b", 16, family=None),
    ]
    assert split.seeds_of(records) == []
    # A key recorded twice is still one key.
    assert split.seeds_of([records[0], records[0]]) == []
