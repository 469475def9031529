"""The daemon's routes, one module per family: a partial (``partials``), whole partitions
(``partitions``), bulk uploads (``bulk``), paged reads with seal, fail and state
(``pages``), the supervisor's heartbeat and lost-daemon verdicts (``heartbeat``,
``lost``), a lost peer's share (``peers``), the status page (``ui``) and the JSON shapes of
listings (``views``). :mod:`shuffled.server.app` wires them."""
