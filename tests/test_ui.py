"""The status page (``GET /ui``): served by a real daemon, rendered by a real browser
(Debian's headless Chromium) for its DOM and a screenshot; the same auth as ``/status``."""

from __future__ import annotations

import shutil
import struct
import subprocess
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import arrow_bytes, sample_table
from tests.test_bulk_client import FAST

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags a sandboxed root needs, and no background traffic (the network is closed).
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _get(url: str, token: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Path]]:
    base = tmp_path_factory.mktemp("ui")
    locations = [base / "disk-a", base / "disk-b&c"]  # '&' must come out escaped
    with EmbeddedDaemon(locations, free_space_reserve=0) as url:
        with ShuffleClient(url, retry=FAST) as c:
            key = PartialKey("index_parallel_wiki_2026", "p0-a1-f0", Interval(0, 86_400_000), 0)
            c.put_partial(key, arrow_bytes(sample_table(50)))
            c.seal("index_parallel_wiki_2026", ["p0-a1-f0"])
        yield url, locations


def test_page_lists_locations_tasks_and_sweeps(held: tuple[str, list[Path]]) -> None:
    url, locations = held
    for path in ("/ui", "/"):
        status, ctype, html = _get(url + path)
        assert status == 200 and ctype.startswith("text/html")
        for loc in locations:
            assert str(loc).replace("&", "&amp;") in html
        assert "index_parallel_wiki_2026" in html and "sealed" in html
        assert "no sweep yet" in html and "<script" not in html


def test_page_needs_the_token_when_status_does(tmp_path: Path) -> None:
    token = "t-" + tmp_path.name  # generated per run
    with EmbeddedDaemon([tmp_path / "l"], free_space_reserve=0, auth_token=token) as url:
        assert _get(url + "/status")[0] == 401 and _get(url + "/ui")[0] == 401
        assert _get(url + "/ui", token)[0] == 200 and _get(url + "/status", token)[0] == 200


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed (filtered) scanlines of a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, size = 8, b"", (0, 0)
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        at += 12 + length
    return size[0], size[1], zlib.decompress(idat)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                    "(make sysdeps-test installs it)")
def test_chromium_renders_the_page(held: tuple[str, list[Path]], tmp_path: Path) -> None:
    url, locations = held
    flags = [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", url + "/ui"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert 'id="locations"' in dom and 'id="tasks"' in dom and 'id="sweeps"' in dom
    for loc in locations:
        assert str(loc).replace("&", "&amp;") in dom
    assert "index_parallel_wiki_2026" in dom
    shot = tmp_path / "status.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1200,800", url + "/ui"],
                   capture_output=True, timeout=120, check=True)
    width, height, pixels = _png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 800)
    assert len(set(pixels)) > 16, "the screenshot is one flat colour"
