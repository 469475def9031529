"""The supervisor (the Spark driver): runs both phases, keeps the shuffle data alive,
reports, publishes and deletes the shuffle data at the end.

``pipeline`` is :func:`run_ingestion`, ``context`` the typed settings of one job, ``job``
its steps, ``recompute`` what a lost daemon costs, ``monitor`` the heartbeat and progress
threads, ``report`` the task report and ``sparksession`` the Spark session.
"""
