"""The daemon's routes, one module per family: a partial (``partials``), whole partitions
(``partitions``), bulk uploads (``bulk``), paged reads with seal, fail and state
(``pages``), task listings and DELETE (``tasks``), the daemon's status and metrics
(``status``), the supervisor's heartbeat and lost-daemon verdicts (``heartbeat``,
``lost``), a lost peer's share (``peers``), the status page (``ui``); ``params`` parses
what a request names and ``views`` shapes the listings. :mod:`shuffled.server.app` wires
them."""
