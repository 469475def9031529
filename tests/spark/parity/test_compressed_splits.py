"""A compressed file is one split (Druid reads a file per split and cannot start inside a
compressed stream: https://druid.apache.org/docs/latest/ingestion/native-batch#splithintspec,
"maxSplitSize ... a single file cannot be split"), and extensions Druid decompresses that
this reader does not (.zip, .sz) are refused by name before anything runs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from shuffled.spark import SpecError, parse_spec
from shuffled.spark.phase1.native.reader import SplitSizing, plan_native
from shuffled.spark.phase1.source import resolve_files
from shuffled.spark.spec.model import PartitionPlan
from tests.helpers.parity import spec_for

ROWS = "".join(f'{{"ts": "2013-01-01T00:{i % 60:02d}:00Z", "origin": "o{i % 7}"}}\n'
               for i in range(20000)).encode()


def _plan(base: Path) -> list[tuple[str, tuple[int, ...]]]:
    spec = parse_spec(spec_for(base, {"type": "json"}, dimensions=["origin"],
                               metrics=[{"type": "count", "name": "count"}], filter_="*.json*"))
    planned = plan_native(spec, PartitionPlan("hashed", (), num_shards=1), resolve_files(spec),
                          SplitSizing(max_bytes=64 << 10, open_cost=0, parallelism=8))
    assert not isinstance(planned, str), planned
    return [(s.path, s.row_groups) for task in planned[1] for s in task]


def test_a_compressed_file_is_one_split_a_plain_one_many(tmp_path: Path) -> None:
    (tmp_path / "plain.json").write_bytes(ROWS)
    (tmp_path / "packed.json.gz").write_bytes(gzip.compress(ROWS))
    splits = _plan(tmp_path)
    packed = [s for s in splits if s[0].endswith(".gz")]
    plain = [s for s in splits if s[0].endswith("plain.json")]
    assert packed == [(str(tmp_path / "packed.json.gz"), (0,))]
    assert len(plain) > 1


@pytest.mark.parametrize("ext", [".zip", ".sz"])
def test_compressions_not_read_here_are_refused_by_name(tmp_path: Path, ext: str) -> None:
    (tmp_path / f"a.json{ext}").write_bytes(b"PK\x03\x04")
    spec = parse_spec(spec_for(tmp_path, {"type": "json"}, dimensions=["origin"],
                               metrics=[{"type": "count", "name": "count"}], filter_="*"))
    with pytest.raises(SpecError) as info:
        resolve_files(spec)
    assert info.value.path == "$.spec.ioConfig.inputSource" and ext in str(info.value)
