"""``shuffled serve`` sets glibc's allocator (server.heap.tune_malloc) and puts Arrow's
allocations on it (cli.serve): observed, not assumed.

With the mmap threshold fixed at 4 MiB, every 8 MiB buffer is a fresh mapping (its pages
fault in each time); glibc's default raises the threshold after the first such buffer is
freed and then reuses heap pages. Each side runs in a fresh interpreter so the test
process's own allocator is left alone.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from shuffled.server.heap import MALLOPTS
from tests.helpers.procs import DaemonProcess

PROBE = """
import resource, sys
from shuffled.server.heap import tune_malloc
took = tune_malloc() if sys.argv[1] == "tuned" else None
bytearray(8 << 20)  # the first one: glibc's default raises its threshold after it
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    bytearray(8 << 20)  # zero-filled: every page is touched
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuned_heap_maps_large_buffers_afresh_and_default_reuses_them() -> None:
    took, tuned = _faults("tuned")
    _, default = _faults("default")
    assert took == "True"
    # Every buffer a fresh mapping faults at least once (2,048 times with 4 KiB pages, a
    # few with transparent huge pages set to "always"); reused heap pages do not fault.
    assert tuned >= 20, (tuned, default)  # mmap threshold fixed below 8 MiB
    assert default * 4 < tuned, (tuned, default)  # the probe tells the two apart
    assert dict(MALLOPTS)[-3] == 4 << 20


@pytest.mark.parametrize("env, pool", [
    (("env", "-u", "ARROW_DEFAULT_MEMORY_POOL"), "system"),  # serve's choice: glibc's heap
    (("env", "ARROW_DEFAULT_MEMORY_POOL=mimalloc"), "mimalloc"),  # an operator's wins
])
def test_serve_puts_arrows_allocations_on_the_heap_unless_told(
        tmp_path: Path, env: tuple[str, ...], pool: str) -> None:
    with DaemonProcess([tmp_path / "a"], wrapper=env) as daemon, \
            urllib.request.urlopen(f"{daemon.url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("shuffled_build_info{")]
    assert f'arrow_memory_pool="{pool}"' in line, line
