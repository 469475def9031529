"""Slabs at rest (storage format 4): one file per phase-1 flush, its catalog row, reads of
a shard planned from the slabs' indexes (docs/slab.md).

- :mod:`.files`: where a slab lives and how it becomes durable (written under a temporary
  name, synced, renamed): a slab file is whole or absent, and it is self-describing (the
  request's bytes as they came), so the catalog row can be rebuilt from it;
- :mod:`.rows`: the catalog's ``slabs`` table, one named row per slab;
- :mod:`.check`: what a client declares checked before it is believed (sections, batch
  declarations, the index against the data);
- :mod:`.receive`: an upload, streamed to its file, validated off the event loop;
- :mod:`.shards`: the batches of a (chunk, key range) chosen from the indexes in one
  vectorised pass, the edge batches trimmed;
- :mod:`.service`: :class:`~.service.Slabs`, what the store composes.

Why a file per slab and not the task's pack: a slab is a flush (megabytes), so a file costs
one create and one rename per flush, and gives whole-or-nothing at a crash without a
commit record (the rename is the commit); packs exist because a partial is 64 KiB.
"""
