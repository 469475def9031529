"""Where a slab upload's daemon CPU goes: the profile issue 37's exception asks for, kept
runnable (docs/benchmarks.md, "Where a slab upload's CPU goes").

``python -m bench.slab_profile --seconds 10 [--py-spy FILE]`` starts a daemon (fsync on,
one location under a fresh temporary folder), builds the 1,000 x 64 KiB comparison's rows as
ONE slab (one batch per partial, as comparison 3's slab row does) and uploads it over and
over from one client, deleting each task after its upload, for ``--seconds``. It prints
the daemon's user and system CPU per GB from ``/proc/<pid>/stat`` and its peak RSS (heap
and mapped files apart, polled); with ``--py-spy`` it
also records the daemon with ``py-spy record --gil`` into FILE (speedscope JSON, or an SVG
by its suffix) and prints the share of GIL-holding samples whose stack has each of the
named frames. Bounded: ``--seconds`` (at most 120) and a cap of 1,000 uploads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.daemon import Daemon
from bench.data import total, write_partials
from bench.ingest import _Shuffled
from bench.procs import RssPoller, status_kib

CLK_TCK = os.sysconf("SC_CLK_TCK")
MAX_UPLOADS = 1000


def cpu(pid: int) -> tuple[float, float]:
    """(user, system) seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def shares(speedscope: Path, frames: list[str]) -> dict[str, float]:
    """Per frame name (a substring of the function's name or file), the share of samples
    whose stack holds it."""
    doc = json.loads(speedscope.read_text())
    names = [f"{f['name']} {f.get('file', '')}" for f in doc["shared"]["frames"]]
    hits: Counter[str] = Counter()
    samples = 0
    for profile in doc["profiles"]:
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            samples += weight
            seen = {n for n in frames for i in stack if n in names[i]}
            for n in seen:
                hits[n] += weight
    return {n: round(hits[n] / samples, 4) if samples else 0.0 for n in frames}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--py-spy", type=Path, default=None)
    ap.add_argument("--frames", default="data_section,declarations,stream_data,"
                    "write_chunks,feed_data,check_sections,insert")
    args = ap.parse_args(argv)
    seconds = min(max(args.seconds, 1.0), 120.0)
    base = Path(tempfile.mkdtemp(prefix="slab-profile-"))
    try:
        files = write_partials(base / "files", 1000, 64 << 10)
        with Daemon(base / "loc", fsync=True) as daemon:
            side = _Shuffled(daemon, files, 1)
            side.slab()  # builds the slab once, and warms the daemon
            side.after()
            assert daemon.proc is not None
            pid = daemon.proc.pid
            spy = None
            if args.py_spy is not None:
                fmt = "speedscope" if args.py_spy.suffix == ".json" else "flamegraph"
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--gil", "-r", "250",
                     "-d", str(int(seconds)), "-f", fmt, "-o", str(args.py_spy), "-p", str(pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            poller = RssPoller(pid).start()
            u0, s0 = cpu(pid)
            began = time.monotonic()
            uploads = 0
            while time.monotonic() - began < seconds and uploads < MAX_UPLOADS:
                side.slab()
                side.after()
                uploads += 1
            wall = time.monotonic() - began
            u1, s1 = cpu(pid)
            hwm = status_kib(pid, "VmHWM") / 1024
            polled = poller.stop()
            if spy is not None:
                spy.wait(timeout=seconds + 60)
        gb = uploads * total(files) / 1e9
        out = {"uploads": uploads, "gb": round(gb, 3), "mb_per_s": round(gb * 1e3 / wall, 1),
               "user_s_per_gb": round((u1 - u0) / gb, 3),
               "system_s_per_gb": round((s1 - s0) / gb, 3),
               "cpu_s_per_gb": round((u1 - u0 + s1 - s0) / gb, 3),
               "daemon_peak_rss_mib": round(hwm, 1),
               "polled_peaks_mib": {k: round(v, 1) for k, v in polled.items()}}
        if args.py_spy is not None and args.py_spy.suffix == ".json" and args.py_spy.exists():
            out["gil_samples_holding"] = shares(args.py_spy, args.frames.split(","))
        print(json.dumps(out, indent=1))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
