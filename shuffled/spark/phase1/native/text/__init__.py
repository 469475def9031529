"""Newline-delimited JSON and CSV read natively: the driver's plan of blocks (``plan``),
byte blocks cut at line boundaries (``blocks``), lines parsed as Spark's ``from_json``
and ``from_csv`` would (``json_lines``, ``csv_lines``), the schema a task reads JSON with
(``schema``), what the JVM reader makes of each value (``values``), phase-1 rows of them
(``prepare``) and one task's read (``reader``)."""
