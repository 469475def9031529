"""Spec parsing: a Druid ``index_parallel`` spec to the typed :class:`~.model.IngestSpec`.

Pure Python, no pyspark: the driver validates a spec (refusing what is unsupported by its
JSON path) before Spark starts. ``model`` is the parsed form, ``parse`` the entry point,
``ioconfig`` the ``ioConfig``/``tuningConfig`` parts, ``base`` the shared validators and
``granularity`` Druid's granularities as truncation functions.
"""
