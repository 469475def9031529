"""``python -m bench.codecs``: what compressing partials costs and saves, per codec.

Encodes the partials of the two end-to-end shapes with phase 1's own encoder and decodes
them as phase 2 does: a Druid-shaped partial (~200 rolled-up rows: one day x one shard of
one subtask) and a comparison-5 partial (~50k rows). Prints bytes relative to
uncompressed and microseconds per partial to encode and to decode (medians of 5 rounds),
so the default of ``tuningConfig.partialCompression`` is a measured choice.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pyarrow as pa

from shuffled.spark.phase1.partials import CODECS, Encoder

SHAPES = {"druid (200 rows)": (200, 2000), "comparison 5 (50k rows)": (50_000, 40)}


def _batch(rows: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    return pa.record_batch({
        "__time": pa.array(np.sort(rng.integers(0, 86_400_000, rows)) // 3_600_000
                           * 3_600_000, pa.int64()),
        "carrier": pa.array(rng.choice([f"C{i}" for i in range(20)], rows)),
        "origin": pa.array(rng.choice([f"AP{i:03d}" for i in range(300)], rows)),
        "dest": pa.array(rng.choice([f"AP{i:03d}" for i in range(300)], rows)),
        "flight": pa.array(rng.integers(1, 9999, rows).astype(str)),
        "count": pa.array(rng.integers(1, 4, rows), pa.int64()),
        "delay": pa.array(rng.integers(0, 300, rows), pa.int64()),
        "distance": pa.array(rng.random(rows) * 3000),
    })


def main() -> None:
    print(f"{'shape':26} {'codec':5} {'bytes':>7} {'encode us':>10} {'decode us':>10}")
    for shape, (rows, count) in SHAPES.items():
        batches = [_batch(rows, i) for i in range(count)]
        plain = sum(len(Encoder(b.schema).encode(b)) for b in batches)
        for codec in CODECS:
            enc = Encoder(batches[0].schema, codec)
            runs_e, runs_d, size = [], [], 0
            for _ in range(5):
                started = time.perf_counter()
                bodies = [enc.encode(b) for b in batches]
                runs_e.append((time.perf_counter() - started) / count * 1e6)
                started = time.perf_counter()
                for body in bodies:
                    pa.ipc.open_stream(body).read_all()
                runs_d.append((time.perf_counter() - started) / count * 1e6)
                size = sum(map(len, bodies))
            print(f"{shape:26} {codec:5} {size / plain:7.2f} {statistics.median(runs_e):10.0f} "
                  f"{statistics.median(runs_d):10.0f}")


if __name__ == "__main__":
    main()
