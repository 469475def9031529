"""Phase 1 without the JVM hand-off: a task's files read by pyarrow on the executor
(``reader``), in time order (``timeorder``), range partitions of its rows (``ranges``),
and the newline-delimited JSON and CSV side (``text``). Never imports pyspark."""
