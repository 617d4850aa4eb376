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


def test_the_parent_of_workers_foresees_every_processs_plan():
    # `kerneltune tune --workers` reports what each worker tunes without asking it:
    # `plans_for` must give what `plan` gives each process of the job.
    from tests.tuning.test_distributed import FakeKV, run_as_processes

    records = [
        FakeRecord("matmul@v3", "k1", 512),
        FakeRecord("matmul@v3", "k2", 4096),
        FakeRecord("matmul@v3", "k3", 1024),
        FakeRecord("matmul@v3", "k6", 2048),
        FakeRecord("norm@v1", "k0", 64),
    ]
    plans = run_as_processes(2, lambda peers: split.plan(records, peers), FakeKV())
    assert split.plans_for(records, 2) == plans
    # The dear matmul by both; the rest dealt by cost, each key once.
    assert [r.call_key for r in plans[0].seeds] == ["k2"]
    dealt = [r.call_key for p in plans for r in p.share]
    assert sorted(dealt) == ["k0", "k1", "k3", "k6"]
