"""The on-disk format: where things live (layout), packs, Arrow streams and their
checked declarations, the records that cross from disk to memory, marks, migrations."""
