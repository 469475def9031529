"""The slab: one phase-1 flush as one Arrow IPC stream in (time chunk, key) order, with an
index of its record batches and per-chunk statistics (docs/slab.md).

- :mod:`.wire`: the bytes on the wire and at rest (version 1), encoded and checked;
- :mod:`.keys`: the sort key of a row (a hash or an order-preserving tuple), as bytes;
- :mod:`.sketch`: the per-chunk statistics (a HyperLogLog of the rolled-up keys, a bounded
  sample of the range key) and their merge;
- :mod:`.build`: a sorted table cut into a slab (the writer's side).

Pure functions over pyarrow and numpy, no I/O: the daemon and the Spark side share them.
"""
