"""Quotas and scoped tokens over slabs (issue 37: "quotas and scoped tokens behave as
today over slabs"): a slab over its task's quota is refused with nothing stored, and a
task token opens only its own task and only for its scope (docs/security.md's table:
POST .../slabs is write, the shard reads are read). A real daemon on loopback; the
secret is made per run."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.errors import Forbidden, QuotaExceeded, Unauthorized
from shuffled.protocol import Interval
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.tokens import Scope, mint
from tests.conftest import files_under
from tests.helpers.slabs import HOUR, make_slab, rows_table

EVERYTHING = [(Interval(0, HOUR), None, None)]


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[str, bytes, list[Path]]]:
    secret = secrets.token_urlsafe(32).encode()
    (tmp_path / "secret").write_bytes(secret + b"\n")
    locations = [tmp_path / "a", tmp_path / "b"]
    with EmbeddedDaemon(locations, free_space_reserve=0,
                        signing_secret_file=str(tmp_path / "secret"),
                        task_quota_bytes=200_000, task_quota_partials=3) as url:
        yield url, secret, locations


def test_a_slab_over_its_tasks_quota_is_refused_and_nothing_stored(
        guarded: tuple[str, bytes, list[Path]]) -> None:
    url, secret, locations = guarded
    admin = mint(secret, "greedy", Scope.ADMIN, 600)
    with ShuffleClient(url, token=admin) as client:
        big = make_slab(rows_table(20_000, seed=1))
        assert big.size > 200_000
        with pytest.raises(QuotaExceeded, match="quota of 200000"):
            client.put_slab("greedy", big)
        for n in range(3):  # three small ones fit the count
            client.put_slab("greedy", make_slab(rows_table(50, seed=n), slab_id=n))
        with pytest.raises(QuotaExceeded, match="quota of 3"):
            client.put_slab("greedy", make_slab(rows_table(50, seed=9), slab_id=3))
        client.seal("greedy", ["sub0"])
        assert client.read_shards("greedy", EVERYTHING)[0].slabs == 3
    slab_files = [p for loc in locations for p in files_under(loc) if p.suffix == ".slab"]
    assert len(slab_files) == 3  # the refused ones left nothing, not even a temp file
    assert not [p for loc in locations for p in files_under(loc) if ".tmp" in p.parts]


def test_a_task_token_opens_its_own_task_for_its_scope_only(
        guarded: tuple[str, bytes, list[Path]]) -> None:
    url, secret, _ = guarded
    slab = make_slab(rows_table(100))
    writer, reader = mint(secret, "mine", Scope.WRITE, 600), mint(secret, "mine", Scope.READ, 600)
    with ShuffleClient(url, token=writer) as w:
        w.put_slab("mine", slab)
        with pytest.raises(Forbidden):  # another task's slabs: not with this token
            w.put_slab("theirs", slab)
        with pytest.raises(Forbidden):  # reading needs the read scope
            w.read_shards("mine", EVERYTHING)
    with ShuffleClient(url, token=mint(secret, "mine", Scope.ADMIN, 600)) as a:
        a.seal("mine", ["sub0"])
    with ShuffleClient(url, token=reader) as r:
        assert r.read_shards("mine", EVERYTHING)[0].slabs == 1
        assert r.read_shard("mine", Interval(0, HOUR), None, None).slabs == 1
        with pytest.raises(Forbidden):  # a reader cannot write
            r.put_slab("mine", make_slab(rows_table(10), slab_id=1))
        with pytest.raises(Forbidden):
            r.read_shards("theirs", EVERYTHING)
    with ShuffleClient(url, token=None) as anonymous, pytest.raises(Unauthorized):
        anonymous.put_slab("mine", slab)
    forged = mint(secrets.token_urlsafe(32).encode(), "mine", Scope.ADMIN, 600)
    with ShuffleClient(url, token=forged) as f, pytest.raises(Unauthorized):
        f.read_shards("mine", EVERYTHING)
