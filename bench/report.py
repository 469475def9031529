"""The table (console and README), ``results.json`` and the machine it ran on."""

from __future__ import annotations

import json
import math
import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.stats import Result

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def machine() -> dict[str, Any]:
    """CPU model, cores, kernel, Python, date (UTC) and load at the start."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load": round(os.getloadavg()[0], 2),
    }


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _met(r: Result) -> str:
    if r.detail.get("error"):
        return "ERROR"
    return {True: "yes", False: "**no**", None: "info"}[r.met]


def table(results: list[Result]) -> str:
    """A Markdown table of every row (readable on a console too)."""
    lines = ["| comparison | ours | baseline | unit | ratio | target | met |",
             "|---|---:|---:|---|---:|---|---|"]
    for r in results:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(f"| {r.title} | {_num(r.ours)} | {_num(r.baseline)} | {r.unit} | {ratio} "
                     f"| {r.target or '-'} | {_met(r)} |")
    return "\n".join(lines)


def machine_line(m: dict[str, Any]) -> str:
    """One line naming the machine."""
    return (f"{m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}, "
            f"{m['date']} (load average {m['load']} at start)")


def errors(results: list[Result]) -> list[str]:
    """One line per comparison that failed to run."""
    return [f"{r.name}: {r.detail['error']}" for r in results if r.detail.get("error")]


def write_json(path: Path, results: list[Result], meta: dict[str, Any]) -> None:
    """``results.json``: the list of result objects (machine and run facts in each's detail
    would repeat; they go in a sibling ``results-meta.json``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([r.to_json() for r in results], indent=1, default=str) + "\n")
    tmp.replace(path)
    meta_path = path.with_name(path.stem + "-meta.json")
    meta_path.write_text(json.dumps(meta, indent=1, default=str) + "\n")


def readme_block(results: list[Result], meta: dict[str, Any]) -> str:
    """The README section body between the markers."""
    notes = "\n".join(f"- {n}" for n in meta.get("notes", []))
    errs = "\n".join(f"- error: {e}" for e in errors(results))
    return "\n".join(x for x in [
        START,
        f"Latest run: `{meta['command']}` on {machine_line(meta['machine'])}; "
        f"took {meta['seconds']:.0f} s{' (quick mode: small sizes)' if meta.get('quick') else ''}.",
        "",
        table(results),
        "",
        notes,
        errs,
        END,
    ] if x is not None)


def update_readme(readme: Path, block: str) -> bool:
    """Replace the marked block in ``readme`` (add a ``## Benchmarks`` section if absent)."""
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if pattern.search(text):
        new = pattern.sub(lambda _m: block, text, count=1)
    else:
        new = text.rstrip("\n") + "\n\n## Benchmarks\n\n" + block + "\n"
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text
