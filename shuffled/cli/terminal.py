"""What `shuffled ingest` shows on a terminal: Spark's JVM kept quiet, one live progress line."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

# Spark's own logging without --verbose: errors only, no banner. Shipped beside this module
# (not written to a temporary file, which every run would leave behind).
QUIET_LOG4J = Path(__file__).with_name("quiet-log4j2.properties")

# What the JVM prints on stderr whatever its log configuration says: Spark's shell banner
# and the JDK's notice. Dropped from a quiet `shuffled ingest`'s terminal (kept with -v).
_BANNER = re.compile(rb"^(Setting default log level to |To adjust logging level use "
                     rb"sc\.setLogLevel|WARNING: Using incubator modules)")
_TICK = re.compile(r"([\d,]+)/([\d,]+) tasks done(.*)$")
_WIDTH = 20


def _label(head: str) -> str:
    """The phase a bar's head names: "phase 1" of "phase 1 (partial segments): ",
    "determine partitions" of "determine partitions (job 2): "."""
    return re.split(r" \(|:", head, maxsplit=1)[0]


def _finished(head: str, line: str) -> bool:
    """Whether ``line`` says the phase whose bar begins with ``head`` is over: "phase 1
    done: ..." after "phase 1 (partial segments): ", "determine partitions: hashed, ..."
    after "determine partitions: "."""
    label = _label(head)
    rest = line[len(label):] if line.startswith(label) else None
    if rest is None:
        return False
    return rest.startswith(" done") or label == "determine partitions"


class QuietStderr:
    """While active, file descriptor 2 (ours and the Spark JVM's, which inherits it) goes
    through a thread that drops :data:`_BANNER` lines and passes everything else on."""

    def __enter__(self) -> QuietStderr:
        sys.stderr.flush()
        self.saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self.thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self.thread.start()
        return self

    def _pump(self, read: int) -> None:
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:  # ends when every writer (the JVM too) has closed it
                if not _BANNER.match(line):
                    os.write(self.saved, line)

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)  # the JVM keeps the pipe: the pump lives while it does


class Progress:
    """Progress lines: on a terminal, the running phase's "N/M tasks done, ..." (tasks,
    rows and bytes so far) is one live line (a text bar rewritten in place); elsewhere,
    and for every other message, plain lines.

    Spark stops listing a stage once its last task finishes, so the last tick seen is
    rarely M/M: when the phase's "... done" line comes, the bar is redrawn full first.
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())
        self.pending: tuple[str, int] | None = None  # (text before the bar, total tasks)

    def _bar(self, head: str, done: int, total: int, tail: str) -> None:
        filled = int(_WIDTH * done / total) if total else 0
        self.stream.write(f"\r\x1b[K{head}[{'#' * filled}{'.' * (_WIDTH - filled)}] "
                          f"{done:,}/{total:,} tasks{tail}")

    def __call__(self, line: str) -> None:
        match = _TICK.search(line)
        if self.live and match:
            done, total = (int(match.group(i).replace(",", "")) for i in (1, 2))
            head = line[:match.start()]
            if self.pending is not None and self.pending[0] != head:
                # A new bar: the phase's next Spark job ("(job 2)"), so the last one ended
                # with every task done, or another phase.
                old, old_total = self.pending
                if _label(old) == _label(head):
                    self._bar(old, old_total, old_total, "")
                self.stream.write("\n")
            self._bar(head, done, total, match.group(3))
            self.pending = (head, total)
        else:
            if self.pending is not None:
                head, total = self.pending
                if _finished(head, line):  # every task of the phase finished
                    self._bar(head, total, total, "")
                self.stream.write("\n")
                self.pending = None
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.pending is not None:
            self.stream.write("\n")
            self.pending = None
