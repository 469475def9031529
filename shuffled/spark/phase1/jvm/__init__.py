"""Phase 1 through Spark's JVM: the input as a DataFrame prepared with Spark SQL columns
(``prepare``), the spec's expressions and filters as Spark SQL (``sqlexpr``,
``filters``), multi-value dimensions (``multivalue``). Its twin on Arrow is
:mod:`shuffled.spark.phase1.arrow_expr`; a differential test holds the two equal."""
