"""Synchronous HTTP client of the shuffled daemon, for Spark executors and the driver.

Imports only the stdlib, ``crc32c``, :mod:`shuffled.protocol` and :mod:`shuffled.errors`.
A :class:`ShuffleClient` holds one keep-alive connection and is not thread-safe.
"""

from shuffled.client.answers import BadResponse
from shuffled.client.client import ShuffleClient
from shuffled.client.digest import crc32c_of
from shuffled.client.retry import RetryPolicy, ShuffleUnavailable, daemon_failed

__all__ = ["BadResponse", "RetryPolicy", "ShuffleClient", "ShuffleUnavailable", "crc32c_of",
           "daemon_failed"]
