"""Which daemon each subtask's slabs are read from under the late plan
(:class:`shuffled.spark.driver.late_recompute.CommittedSlabs`): every kept slab read from
exactly one live daemon, or its subtask re-run. Pure bookkeeping: no Spark, no daemon."""

from __future__ import annotations

from shuffled.spark.driver.late_recompute import CommittedSlabs
from shuffled.spark.records import SlabSent


def slab(task: int, sub: str, n: int, *holders: str) -> SlabSent:
    return SlabSent(task=task, server=holders[0], sub=sub, slab=n, attempt=0, rows=10,
                    bytes=100, chunks=1, replicas=holders if len(holders) > 1 else ())


def reads(c: CommittedSlabs) -> dict[tuple[str, int], list[str]]:
    """Per slab, the daemons it is read from."""
    without = c.without()
    return {(sl.sub, sl.slab): sorted(s for s in sl.holders
                                      if sl.sub not in without.get(s, frozenset()))
            for sl in c.kept}


def test_one_copy_each_is_read_where_it_is_even_split_by_a_failover() -> None:
    c = CommittedSlabs([slab(0, "p0-a1", 0, "A"), slab(0, "p0-a1", 1, "B"),
                        slab(1, "p1-a2", 0, "B")])
    assert c.choose(gone=()) == []
    assert all(len(v) == 1 for v in reads(c).values())
    assert c.counts() == {"A": 1, "B": 2}


def test_replicas_are_read_once_from_a_daemon_holding_the_subtask_whole() -> None:
    c = CommittedSlabs([slab(0, "p0-a1", 0, "A", "B"), slab(0, "p0-a1", 1, "B", "C")])
    assert c.choose(gone=()) == []
    assert reads(c) == {("p0-a1", 0): ["B"], ("p0-a1", 1): ["B"]}
    assert c.counts() == {"B": 2}
    # B lost: each slab still has one live copy, on A and on C
    assert c.choose(gone={"B"}) == []
    assert reads(c) == {("p0-a1", 0): ["A"], ("p0-a1", 1): ["C"]}
    assert c.counts() == {"A": 1, "C": 1}
    # A lost too: slab 0 has no copy left: its subtask is re-run
    assert c.choose(gone={"A", "B"}) == [0]


def test_picks_spread_and_stay_while_they_hold() -> None:
    kept = [slab(t, f"p{t}-a{t}", 0, "A", "B") for t in range(4)]
    c = CommittedSlabs(kept)
    assert c.choose(gone=()) == []
    assert c.counts() == {"A": 2, "B": 2}  # spread by slabs
    before = dict(c.reader)
    c.choose(gone=())
    assert c.reader == before


def test_superseded_subtasks_are_left_out_everywhere() -> None:
    c = CommittedSlabs([slab(0, "p0-a1", 0, "A"), slab(0, "p0-a1", 1, "B")])
    assert c.choose(gone={"A"}) == [0]
    c.replace([0], [slab(0, "p0-a9", 0, "B")])
    assert c.choose(gone={"A"}) == []
    assert c.without() == {"A": frozenset({"p0-a1"}), "B": frozenset({"p0-a1"})}
    assert c.sealed_on() == {"A": {"p0-a1"}, "B": {"p0-a1", "p0-a9"}}
    assert c.counts() == {"B": 1}


def test_a_lost_daemon_in_deep_storage_is_read_through_its_route() -> None:
    """``via``: a lost daemon whose copy is in deep storage is read through a survivor's
    peer route in its place: the same slabs counted there, its seal's ``without`` (the
    subtasks read elsewhere) sent there; nothing re-run. Its route dropped (the copy
    given up), its subtasks are re-run."""
    route = "B/peers/inst-a"
    c = CommittedSlabs([slab(0, "p0-a1", 0, "A"), slab(0, "p0-a1", 1, "A"),
                        slab(1, "p1-a1", 0, "B"), slab(2, "p2-a1", 0, "A", "C")])
    assert c.choose(gone=()) == []
    c.via = {"A": route}
    assert c.choose(gone={"A"}) == []
    assert c.reader["p0-a1"] == frozenset({route})
    assert c.reader["p2-a1"] == frozenset({"C"})  # a live copy: read where it is
    assert c.counts() == {route: 2, "B": 1, "C": 1}
    assert c.without() == {route: frozenset({"p2-a1"}), "B": frozenset(),
                           "C": frozenset()}
    assert "A" not in c.readers
    c.via = {}
    assert c.choose(gone={"A"}) == [0]
