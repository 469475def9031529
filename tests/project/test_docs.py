"""What README.md and docs/ claim, checked against the code where a machine can check it:
the files they link or name exist, the commands and flags they show are the CLI's, the
metrics they name are exported by a fresh daemon, the settings and make targets exist,
the README links the generated references, and nothing points at material a reader
cannot open (a design file outside the repository, the team's seeds or issue numbers).

"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

from shuffled.cli import build_parser
from shuffled.config import FIELDS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
TEXTS = [README, *DOCS]
# Top-level folders whose paths the docs name in backticks.
TOP = ("docs/", "deploy/", "bench/", "tests/", "shuffled/", "examples/", "scripts/")
# Other programs' flags that appear beside `shuffled ...` on one line.
FOREIGN_FLAGS = {"--only", "--skip", "--quick"}


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- files ---------------------------------------------------------------------------------


def test_every_linked_or_named_file_exists() -> None:
    missing = []
    for doc in TEXTS:
        text = _read(doc)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                missing.append(f"{_name(doc)} links {target}")
        for token in re.findall(r"`([^`\s]+)`", text):
            if token.startswith(TOP) and not re.search(r"[*{}<>]|\.\.\.|NAME", token):
                path = token.split(":", 1)[0].rstrip(".,")
                if not (ROOT / path).exists():
                    missing.append(f"{_name(doc)} names {token}")
    assert not missing, "\n".join(missing)


def test_no_doc_points_at_what_a_reader_cannot_open() -> None:
    bad = []
    for doc in [*TEXTS, ROOT / "openapi.yaml", ROOT / "pyproject.toml"]:
        for n, line in enumerate(_read(doc).splitlines(), 1):
            if re.search(r"(?<!docs/)\bDESIGN\.md|\bseeds?\b (0\d\d)|the seed's|\bissue \d+",
                         line):
                bad.append(f"{_name(doc)}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


# --- commands, flags, settings, make targets ------------------------------------------------


def _commands() -> dict[str, set[str]]:
    """Each subcommand of `shuffled` -> its option strings."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {s for a in p._actions for s in a.option_strings}
            for name, p in sub.choices.items()}


def _command_lines() -> list[tuple[str, str]]:
    """(where, text) for each `shuffled <command> ...` the docs show, a shell line with its
    backslash continuations joined, or an inline code span."""
    found = []
    for doc in TEXTS:
        text = _read(doc)
        joined = re.sub(r"\\\n\s*", " ", text)
        for line in joined.splitlines():
            for span in re.findall(r"`([^`]*\bshuffled [a-z-]+[^`]*)`", line) or (
                    [line] if re.search(r"(^|\s)shuffled [a-z]", line) and "`" not in line
                    else []):
                found.append((_name(doc), span))
    return found


def test_commands_and_flags_shown_exist() -> None:
    commands = _commands()
    global_flags = {"--help", "-h", "--version"}
    wrong = []
    shown = 0
    for where, text in _command_lines():
        for match in re.finditer(r"\bshuffled ([a-z][a-z-]*)(.*)", text):
            command, rest = match.group(1), match.group(2)
            if command not in commands:
                if command in ("serve", "ingest", "migrate", "config-reference"):
                    wrong.append(f"{where}: no command {command}")
                continue  # prose: "shuffled keeps ...", "shuffled ingest" checked above
            shown += 1
            rest = re.split(r"\bshuffled [a-z]", rest)[0]  # up to the next command
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                if flag not in commands[command] | global_flags | FOREIGN_FLAGS:
                    wrong.append(f"{where}: shuffled {command} has no {flag}: {text[:90]}")
    assert shown >= 5, "the docs show shuffled commands; the extraction found too few"
    assert not wrong, "\n".join(wrong)


def test_every_setting_is_documented_and_every_env_variable_named_is_one() -> None:
    reference = _read(ROOT / "docs" / "configuration.md")
    for spec in FIELDS:
        assert spec.flag in reference and spec.name in reference, spec.name
    names = {f"SHUFFLED_{spec.name.upper()}" for spec in FIELDS}
    names |= {"SHUFFLED_AUTH_TOKEN", "SHUFFLED_LOG_LEVEL"}  # read by shuffled ingest too
    names |= {"SHUFFLED_ICEBERG_HOME"}  # the ingestion's embedded Iceberg catalog (iceberg.md)
    unknown = sorted({(doc.name, v) for doc in TEXTS
                      for v in re.findall(r"\bSHUFFLED_[A-Z_]+[A-Z]\b", _read(doc))
                      if v not in names})
    assert not unknown, unknown


def test_make_targets_named_exist() -> None:
    makefile = _read(ROOT / "Makefile")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    for doc in TEXTS:
        for target in re.findall(r"\bmake ([a-z][a-z-]+)\b", _read(doc)):
            if target in ("a", "it", "sure", "the"):  # prose
                continue
            assert target in targets, f"{doc.name}: make {target}"


# --- metrics --------------------------------------------------------------------------------


def test_every_metric_named_is_exported(daemon_url: str) -> None:
    from tests.helpers.procs import http_get

    status, _, body = http_get(daemon_url + "/metrics")
    assert status == 200
    exported = set(re.findall(r"^(shuffled_[a-z_]+)", body.decode(), re.M))
    exported |= {re.sub(r"_(bucket|sum|count)$", "", m) for m in exported}  # histograms
    named = {(doc.name, m) for doc in [*TEXTS, ROOT / "deploy/prometheus/shuffled-rules.yml"]
             for m in re.findall(r"\bshuffled_[a-z][a-z_]*[a-z]\b", _read(doc))}
    missing = sorted((doc, m) for doc, m in named if m not in exported)
    assert not missing, missing
    documented = {m for _, m in named}
    # prometheus_client's companions: a histogram's series, a counter's _created.
    undocumented = sorted(m for m in exported if m not in documented and
                          re.sub(r"_(bucket|sum|count)$", "", m) not in documented and
                          re.sub(r"_created$", "_total", m) not in documented and
                          re.sub(r"_created$", "", m) not in documented)
    assert not undocumented, f"exported but in no doc: {undocumented}"


def test_readme_points_at_the_generated_references() -> None:
    """The README is a user's guide: the settings and metrics tables live in their generated
    pages (docs/configuration.md, docs/metrics.md, each kept in sync by a test), and the
    README links them rather than copying them."""
    readme = _read(README)
    for page in ("docs/configuration.md", "docs/metrics.md", "docs/spec-coverage.md",
                 "docs/differences-from-druid.md", "CONTRIBUTING.md"):
        assert f"]({page})" in readme, f"README does not link {page}"
    assert "<!-- settings:start" not in readme and "<!-- metrics:start" not in readme
    assert len(readme.splitlines()) < 250, "the README grew past a user's guide"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
