"""`shuffled ingest --stall-timeout SECONDS`: a number of seconds above 0, refused with exit
code 2 otherwise (before anything starts); absent, the watchdog's default (300 s)."""

from __future__ import annotations

import pytest

from shuffled.cli import build_parser, main


def test_the_stall_timeout_is_seconds_and_defaults_to_none() -> None:
    args = build_parser().parse_args(["ingest", "spec.json", "--stall-timeout", "7.5"])
    assert args.stall_timeout == 7.5
    assert build_parser().parse_args(["ingest", "spec.json"]).stall_timeout is None


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_a_stall_timeout_that_is_not_positive_seconds_is_refused(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["ingest", "spec.json", "--stall-timeout", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--stall-timeout" in err and "seconds" in err, err


def test_the_default_is_a_few_minutes() -> None:
    from shuffled.spark.driver.watchdog import DEFAULT_STALL_SECONDS

    assert DEFAULT_STALL_SECONDS == 300
