"""Settings: sources and precedence, failures naming the setting, `serve --help`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shuffled.cli import build_parser, main
from shuffled.config import FIELDS, load_settings, parse_duration, parse_size, reference_markdown
from shuffled.errors import ConfigError

ROOT = Path(__file__).parents[2]


def test_precedence_defaults_toml_env_flags(tmp_path: Path) -> None:
    toml = tmp_path / "shuffled.toml"
    toml.write_text('port = 9000\nexpiry_timeout = "PT5M"\nlocations = ["/a", {path = "/b", '
                    'max_bytes = "1GiB", reserve_bytes = 0}]\nfsync = false\n')
    env = {"SHUFFLED_PORT": "9100", "SHUFFLED_SWEEP_PERIOD": "PT30S"}
    s = load_settings(toml, env, {"port": 9200})
    assert s.port == 9200 and s.sweep_period == 30 and s.expiry_timeout == 300
    assert s.fsync is False
    assert [str(loc.path) for loc in s.locations] == ["/a", "/b"]
    assert s.locations[1].max_bytes == 1 << 30 and s.locations[1].reserve_bytes == 0
    assert load_settings(toml, env).port == 9100


@pytest.mark.parametrize("overrides,setting", [
    ({"locations": []}, "locations"),
    ({"port": "99999"}, "port"),
    ({"max_partial_bytes": "lots"}, "max_partial_bytes"),
    ({"expiry_timeout": "PT"}, "expiry_timeout"),
    ({"sweep_period": "0"}, "sweep_period"),
    ({"fsync": "maybe"}, "fsync"),
    ({"tls_cert": "/x.pem"}, "tls_cert"),
    ({"max_age": "1", "expiry_timeout": "10"}, "max_age"),
    ({"auth_token_file": "/nonexistent/token"}, "auth_token_file"),
    ({"max_concurrent_uploads": "0"}, "max_concurrent_uploads"),
    ({"log_level": "LOUD"}, "log_level"),
    # a bulk upload of max_bulk_partials could never be taken
    ({"max_bulk_partials": "200000"}, "max_held_partials"),
])
def test_bad_settings_name_the_setting(overrides: dict, setting: str) -> None:
    values = {"locations": ["/tmp/x"], **overrides}
    with pytest.raises(ConfigError) as info:
        load_settings(environ={}, overrides=values)
    assert info.value.details["setting"] == setting
    assert info.value.message.startswith(setting)


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('locations = ["/a"]\nexpiry = 5\n')
    with pytest.raises(ConfigError, match="unknown setting 'expiry'"):
        load_settings(toml, {})


def test_sizes_and_durations() -> None:
    assert parse_size("64MiB", "x") == 64 << 20 and parse_size("10GB", "x") == 10**10
    assert parse_size(5, "x") == 5
    assert parse_duration("PT1H30M", "x") == 5400 and parse_duration("P1D", "x") == 86400
    assert parse_duration("2.5", "x") == 2.5


def test_location_flag_with_size_and_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-per-run\n")
    s = load_settings(environ={}, overrides={"locations": [f"{tmp_path}/a:10MiB"],
                                             "auth_token_file": str(token)})
    assert s.locations[0].max_bytes == 10 << 20 and s.auth_token == "s3cret-per-run"


def test_serve_help_documents_every_setting() -> None:
    proc = subprocess.run([sys.executable, "-m", "shuffled", "serve", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0
    for spec in FIELDS:
        assert spec.flag in proc.stdout, spec.flag
    assert "--config" in proc.stdout


def test_bad_flag_exits_2_naming_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--location", "/tmp/x", "--expiry-timeout", "soon"]) == 2
    assert "expiry_timeout" in capsys.readouterr().err


def test_configuration_reference_is_in_sync() -> None:
    assert (ROOT / "docs" / "configuration.md").read_text() == reference_markdown(), \
        "run `make config-reference`"


def test_parser_builds() -> None:
    assert build_parser().parse_args(["serve"]).command == "serve"


def test_instants_before_year_1000_round_trip() -> None:
    from shuffled.protocol import Interval, format_instant, parse_instant

    assert format_instant(parse_instant("0999-01-01")) == "0999-01-01T00:00:00.000Z"
    interval = Interval.parse("0999-01-01", "1000-01-01")
    assert interval.dirname == "0999-01-01T00:00:00.000Z_1000-01-01T00:00:00.000Z"
    assert Interval.parse(interval.start_iso, interval.end_iso) == interval


def test_readme_links_the_settings_reference() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](docs/configuration.md)" in readme


@pytest.mark.parametrize("text, seconds", [
    ("30m", 1800.0), ("2h", 7200.0), ("1h30m", 5400.0), ("90s", 90.0), ("7d", 604800.0),
    ("1.5h", 5400.0), ("PT5M", 300.0), ("P1D", 86400.0), ("12", 12.0)])
def test_durations_take_the_short_form_beside_iso(text: str, seconds: float) -> None:
    """Issue 39: ``30m`` was refused (only ISO ``PT30M``)."""
    from shuffled.config import parse_duration

    assert parse_duration(text, "expiry_timeout") == seconds


@pytest.mark.parametrize("text", ["", "m", "5x", "1mo", "P", "-5m"])
def test_what_is_not_a_duration_is_refused_naming_the_forms(text: str) -> None:
    from shuffled.config import parse_duration

    with pytest.raises(ConfigError, match="expiry_timeout"):
        parse_duration(text, "expiry_timeout")
