"""What a failed Spark call means: the one paragraph an ingestion fails with.

The driver's Spark calls fail in ways whose raw text (a Java stack trace behind a Py4J
error) names neither what ran short nor what to change: a JVM that ran out of heap and
exited (``-XX:+ExitOnOutOfMemoryError``, set where :mod:`.sparksession` starts the JVM; in
local mode the executors share that heap), a task that ran out of heap, a task result lost
before it reached the driver, results larger than ``spark.driver.maxResultSize``, a lost
executor. :func:`explain` says which, during which phase, and what to try; None for any
other failure (the caller keeps its own message).
"""

from __future__ import annotations

from typing import Any

# Exit codes of a JVM that ran out of memory: HotSpot's -XX:+ExitOnOutOfMemoryError, and
# Spark's SparkExitCode.OOM (an executor's uncaught OutOfMemoryError; in local mode the
# driver's JVM runs the executor).
OOM_EXIT_CODES = {3: "-XX:+ExitOnOutOfMemoryError", 52: "Spark's exit code for it"}

MORE_HEAP = ("raise spark.driver.memory (e.g. --conf spark.driver.memory=4g; in local mode "
             "the executors run in the driver's JVM and share its heap)")


def jvm_exit_code(spark: Any, wait: float = 0.0) -> int | None:
    """The exit code of the driver JVM this Python process started, once it has exited
    (waiting up to ``wait`` seconds for it to); None while it runs (or when it was not
    started here)."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if proc is None:
        return None
    try:
        code: int | None = proc.wait(timeout=wait) if wait > 0 else proc.poll()
    except Exception:  # still running after ``wait``
        return None
    return code


def _lost_the_jvm(exc: BaseException) -> bool:
    """``exc`` says the connection to the JVM broke (it may be exiting right now)."""
    text = str(exc)
    return (isinstance(exc, ConnectionError) or type(exc).__name__ == "Py4JNetworkError"
            or "Answer from Java side is empty" in text
            or "Error while sending or receiving" in text)


def explain(spark: Any, phase: str, exc: BaseException) -> tuple[str, str] | None:
    """(what failed, what to try) for ``exc``, a failure of ``phase``'s Spark work; None
    when it is none of the module docstring's."""
    code = jvm_exit_code(spark, wait=10.0 if _lost_the_jvm(exc) else 0.0)
    if code is not None:
        if code in OOM_EXIT_CODES:
            return (f"the Spark driver JVM ran out of memory (java.lang.OutOfMemoryError) "
                    f"during {phase} and exited (code {code}, {OOM_EXIT_CODES[code]})",
                    MORE_HEAP)
        return (f"the Spark driver JVM exited with code {code} during {phase} (killed, or "
                "out of memory outside its heap)",
                "look for the machine's OOM killer in the kernel log, and check "
                "spark.driver.memory against the memory the machine has")
    text = str(exc)
    if "OutOfMemoryError" in text:
        local = "executor driver" in text
        return (f"a Spark task ran out of JVM heap (java.lang.OutOfMemoryError) in "
                f"{'the driver' if local else 'an executor'} during {phase}",
                (MORE_HEAP if local else "raise spark.executor.memory (e.g. --conf "
                 "spark.executor.memory=8g)") + ", or lower tuningConfig.maxRowsInMemory "
                "and maxBytesInMemory")
    if "TaskResultLost" in text:
        return (f"a task's result was lost before it reached the driver during {phase} "
                "(Spark's TaskResultLost: the block holding it was dropped, the driver's "
                "heap too small to keep it)", MORE_HEAP)
    if "spark.driver.maxResultSize" in text:
        return (f"the results of {phase}'s tasks were larger than "
                "spark.driver.maxResultSize",
                "raise it (e.g. --conf spark.driver.maxResultSize=4g) together with "
                "spark.driver.memory")
    if "ExecutorLostFailure" in text:
        return (f"a Spark executor was lost during {phase} (its process exited, often "
                "ended by the machine's OOM killer)",
                "raise spark.executor.memory and spark.executor.memoryOverhead, or lower "
                "tuningConfig.maxBytesInMemory")
    return None
