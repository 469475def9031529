"""Druid's expressions and filters on Arrow arrays, computing what the JVM side
(:mod:`shuffled.spark.phase1.jvm`) computes in Spark SQL: values, types and operators
(``values``), the functions (``functions``), Java regexes for RE2 (``regex``) and the
``transformSpec`` as a whole (``transform``). Never imports pyspark."""
