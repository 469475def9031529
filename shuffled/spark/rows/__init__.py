"""Columnar rollup kernels both phases share (pyarrow only, no Spark, no client).

``rollup`` names the phase-1 columns and the :class:`~.rollup.Layout` of a job's rows and
combines Arrow tables; ``grouping`` is the sort-based group-by it runs on.
"""
