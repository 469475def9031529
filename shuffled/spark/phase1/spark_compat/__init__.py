"""Spark's own semantics on Arrow, so that the native path gives the JVM path's answers:
its casts of text to numbers (``casts``), its timestamp grammar (``timestamps``) and its
``hash()`` (``murmur3``). Never imports pyspark."""
