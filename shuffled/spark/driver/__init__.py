"""The supervisor (the Spark driver): runs both phases, keeps the shuffle data alive,
reports, publishes and deletes the shuffle data at the end.

``pipeline`` is :func:`run_ingestion`, ``context`` the typed settings of one job,
``monitor`` the keepalive and progress thread, ``report`` the task report and ``session``
the Spark session.
"""
