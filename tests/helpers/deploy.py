"""Helpers for the deployment tests: the Dockerfile read as data, a daemon started with the
image's own command, PromQL metric names, and bounded process handling.

Nothing here sleeps to synchronise: every wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.procs import first_line

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
START_TIMEOUT = 30.0


# --------------------------------------------------------------------------- Dockerfile


@dataclass
class Stage:
    """One build stage of a Dockerfile: its base image and its instructions in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(path: Path = DOCKERFILE) -> list[Stage]:
    """Stages of ``path``: comments dropped, backslash continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        else:
            assert stages, f"{keyword} before FROM in {path}"
            stages[-1].instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    """An exec-form (JSON array) argument list; fails on shell form."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def dockerfile_env(stage: Stage) -> dict[str, str]:
    """Every ``ENV KEY=VALUE ...`` of the stage (the only ENV form used here)."""
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for item in shlex.split(args):
            key, sep, value = item.partition("=")
            assert sep, f"ENV {args!r}: use KEY=VALUE"
            env[key] = value
    return env


def dockerfile_copies(stage: Stage) -> dict[str, Path]:
    """Image path -> source file in the repository, for plain (not --from) COPY lines."""
    copies: dict[str, Path] = {}
    for args in stage.all("COPY"):
        parts = args.split()
        if any(p.startswith("--from") for p in parts):
            continue
        *sources, dest = [p for p in parts if not p.startswith("--")]
        if len(sources) == 1:
            copies[dest] = ROOT / sources[0]
    return copies


def healthcheck_command(stage: Stage) -> list[str]:
    """The HEALTHCHECK's exec-form command."""
    args = stage.last("HEALTHCHECK")
    assert args is not None, "no HEALTHCHECK"
    _, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args}"
    return exec_form(command.strip())


def localise(argv: list[str]) -> list[str]:
    """The image's ``python`` is this interpreter here."""
    assert argv and argv[0] == "python", f"expected a python command, got {argv}"
    return [sys.executable, *argv[1:]]


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A port free on loopback right now (the caller binds it soon after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """SIGTERM the process we started (by pid), then SIGKILL if it does not exit."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def poll(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Call ``check`` until it returns something truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (OSError, ValueError) as exc:  # not up yet: connection refused, bad JSON
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)  # the poll interval of a bounded wait, not synchronisation


@dataclass
class RunningDaemon:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path
    env: dict[str, str]
    locations: list[Path]


def start_daemon(argv: list[str], env: dict[str, str], log: Path,
                 locations: list[Path]) -> RunningDaemon:
    """Start ``argv`` (a ``shuffled serve`` command) and wait, bounded, for its
    ``shuffled listening on URL`` line."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err)
    first = first_line(proc, START_TIMEOUT)
    match = re.match(r"shuffled listening on (http://\S+)", first or "")
    if not match:
        stop(proc)
        raise AssertionError(f"daemon did not start ({argv}): first line {first!r}; "
                             f"log: {log.read_text()[-3000:]}")
    url = match.group(1)
    return RunningDaemon(proc, url, int(url.rsplit(":", 1)[1]), log, env, locations)


def http(method: str, url: str, body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 15.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# --------------------------------------------------------------------------- PromQL

_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan", "le",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers outside label matchers, grouping
    clauses, ranges and strings that are not function calls or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                     # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                    # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)                  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _PROMQL_WORDS:
            continue
        names.add(name)
    return names


_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "info": ("_info",),
             "histogram": ("_bucket", "_count", "_sum", "_created"),
             "summary": ("", "_count", "_sum", "_created"), "untyped": ("",)}


def exported_names(metrics_text: str) -> set[str]:
    """Every sample name a Prometheus text exposition has or declares: a labelled family
    with no sample yet (no rejection so far, no overlord configured) still has its TYPE."""
    names = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            # prometheus_client names counters without _total in TYPE lines.
            base = family.removesuffix("_total") if kind == "counter" else family
            names.update(base + suffix for suffix in _SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


# --------------------------------------------------------------------------- files


def yaml_documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is not None:
            yield doc


def dashboard_exprs() -> list[str]:
    """Every query of the Grafana dashboard (panels inside rows included)."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    exprs = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return exprs


def rule_exprs() -> dict[str, str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "shuffled-rules.yml").read_text())
    return {r.get("alert") or r.get("record"): r["expr"]
            for group in rules["groups"] for r in group["rules"]}


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub makes from a document's headings (and explicit ``<a id>`` tags)."""
    anchors = set(re.findall(r'<a (?:id|name)="([^"]+)"', markdown))
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"#{1,6}\s+(.*)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors
