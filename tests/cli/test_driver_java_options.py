"""The driver JVM `shuffled ingest` starts exits on an OutOfMemoryError whatever else its
Java options say: spark-submit keeps only the last of ``--driver-java-options`` and
``--conf spark.driver.extraJavaOptions``, so the user's options, the quiet log
configuration and ``-XX:+ExitOnOutOfMemoryError`` go in one (the JVM's own arguments are
checked in tests/spark/test_no_hang.py, which runs it out of heap)."""

from __future__ import annotations

import shlex

import pytest

from shuffled.cli.ingest import submit_args
from shuffled.spark.driver.sparksession import DRIVER_JAVA_OPTIONS


def _java(args: str) -> list[str]:
    words = shlex.split(args)
    assert words[-1] == "pyspark-shell" and words.count("--driver-java-options") == 1
    assert not any(w.startswith("spark.driver.extraJavaOptions=") for w in words)
    return shlex.split(words[words.index("--driver-java-options") + 1])


@pytest.mark.parametrize("quiet", [True, False])
def test_one_java_option_holds_the_users_the_log_and_the_oom_exit(
        quiet: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    args = submit_args([("spark.driver.extraJavaOptions", "-Dmine=1 -Xss4m"),
                        ("spark.driver.memory", "512m")], quiet=quiet)
    java = _java(args)
    assert java[:2] == ["-Dmine=1", "-Xss4m"] and java[-1] == DRIVER_JAVA_OPTIONS
    assert any(j.startswith("-Dlog4j2.configurationFile=") for j in java) is quiet
    assert "spark.driver.memory=512m" in shlex.split(args)


def test_a_users_own_submit_args_are_left_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-java-options -Dtheirs=1 pyspark-shell")
    args = submit_args([("spark.executor.memory", "2g")], quiet=True)
    assert args == ("--driver-java-options -Dtheirs=1 --conf spark.executor.memory=2g "
                    "pyspark-shell")
