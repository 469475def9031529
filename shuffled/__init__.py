"""shuffled: an intermediary shuffle data server and the PySpark two-phase ingestion using it."""

__version__ = "0.2.0"
