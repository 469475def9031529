"""Phase 1: read the input, bucket each row by time chunk and partition, roll it up locally
and ship partial segments to the shuffle daemons.

``source`` lists and loads the input, ``prepare`` does the per-row work in Spark SQL,
``determine`` plans the partitions, ``native`` reads Parquet with pyarrow on the executors,
``sparkhash`` reproduces Spark's hash there, ``partials`` cuts and encodes partials and
``tasks`` is what runs in each Spark task (native or through the JVM data source).
"""
