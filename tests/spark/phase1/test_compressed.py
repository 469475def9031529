"""Compressed partials (tuningConfig.partialCompression): phase 1's encoder writes Arrow IPC
with LZ4-frame or ZSTD buffers; the daemon stores and splices them as they came (the
aggregate GET stays zero-copy: compression is per batch, the schema message is the same);
readers decompress. Mixed codecs in one partition read back too."""

from __future__ import annotations

import urllib.parse
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.spark.phase1.partials import Encoder
from shuffled.spark.spec.parse import parse_spec
from tests.conftest import PREFIX
from tests.helpers.clients import FAST
from tests.helpers.spec_changes import with_change

DAY = 86_400_000


def _batch(rows: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    return pa.record_batch({
        "__time": pa.array(np.sort(rng.integers(0, DAY, rows)), pa.int64()),
        "country": pa.array(rng.choice(["fr", "de", "us", "jp"], rows)),
        "count": pa.array(rng.integers(1, 5, rows), pa.int64()),
        "revenue": pa.array(rng.random(rows)),
    })


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_encoder_round_trips_and_shares_the_schema_message(codec: str) -> None:
    batch = _batch(5000, 1)
    enc = Encoder(batch.schema, codec)
    body = enc.encode(batch)
    assert body.startswith(enc.head) and body.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    assert pa.ipc.open_stream(body).read_all().equals(pa.Table.from_batches([batch]))
    plain = Encoder(batch.schema).encode(batch)
    assert enc.raw_bytes >= len(plain) * 0.9  # what it would have taken uncompressed
    if codec != "none":
        assert len(body) < len(plain) * 0.8  # it does compress this data
    small = _batch(50, 2)  # under COMPRESS_MIN_BYTES: never compressed (it would not pay)
    assert enc.encode(small) == Encoder(small.schema).encode(small)


def test_the_setting_is_validated() -> None:
    assert parse_spec(with_change("spec.tuningConfig", {"type": "index_parallel"})
                      ).partial_compression == "lz4"
    spec = with_change("spec.tuningConfig", {"type": "index_parallel",
                                             "partialCompression": "snappy"})
    with pytest.raises(Exception) as info:
        parse_spec(spec)
    assert getattr(info.value, "path", "") == "$.spec.tuningConfig.partialCompression"


def test_compressed_partials_are_spliced_and_read_back(daemon_url: str) -> None:
    key = PartitionKey("zip", Interval(0, DAY), 0)
    batches = {f"s{i}": _batch(2000 + i, i) for i in range(6)}
    codecs = ["lz4", "zstd", "none", "lz4", "zstd", "none"]
    with ShuffleClient(daemon_url, retry=FAST) as c:
        c.put_partials("zip", [(PartialKey("zip", s, key.interval, 0),
                                Encoder(b.schema, codec).encode(b))
                               for (s, b), codec in zip(batches.items(), codecs)])
        whole = c.get_partition(key)  # verified against its Content-Digest (zero-copy plan)
        (bulk,) = c.get_partitions("zip", [(key, None)])
    assert bulk == whole  # the bulk read's frame is the spliced stream, byte for byte
    query = urllib.parse.urlencode(key.query())
    with urllib.request.urlopen(f"{daemon_url}{PREFIX}/tasks/zip/partition?{query}",
                                timeout=30) as resp:
        # the zero-copy plan: length and digest known before a byte is sent, no re-encoding
        assert resp.headers["Content-Digest"] and int(resp.headers["Content-Length"]) == len(whole)
        assert resp.read() == whole
    table = pa.ipc.open_stream(whole).read_all()
    want = pa.Table.from_batches([batches[s] for s in sorted(batches)])
    assert table.equals(want)
