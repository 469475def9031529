"""A segment's Parquet file, encoded here for the small segments (:mod:`.plain`) through
the Thrift compact protocol (:mod:`.thrift`); pyarrow writes every other one."""
