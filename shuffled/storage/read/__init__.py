"""Reads: lookups and partitions, a stored partial as its Arrow stream (zero-copy or
re-encoded), and the page plan of paged reads."""
