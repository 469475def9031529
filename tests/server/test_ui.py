"""The status page (``GET /ui``): served by a real daemon, rendered by a real browser
(Debian's headless Chromium) for its DOM and a screenshot. With auth on it takes the
bearer token or, from a browser, HTTP basic auth with the token as password; it names the
machine and address, and its bar shows the file system's use apart from ours."""

from __future__ import annotations

import base64
import re
import secrets
import shutil
import socket
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
from tests.helpers.clients import FAST

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags a sandboxed root needs, and no background traffic (the network is closed).
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _get(url: str, token: str | None = None, basic: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if basic:
        request.add_header("Authorization",
                           "Basic " + base64.b64encode(basic.encode()).decode())
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
    token = secrets.token_urlsafe(24)  # generated per run
    with EmbeddedDaemon([tmp_path / "l"], free_space_reserve=0, auth_token=token) as url:
        assert _get(url + "/status")[0] == 401
        assert _get(url + "/ui", token)[0] == 200 and _get(url + "/status", token)[0] == 200
        # A browser: /ui answers a basic-auth challenge and a page saying what to type.
        status, ctype, html = _get(url + "/ui")
        assert status == 401 and ctype.startswith("text/html") and 'id=login' in html
        request = urllib.request.Request(url + "/ui")
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as err:
            assert err.headers["WWW-Authenticate"].startswith('Basic realm="shuffled status"')
        # Basic auth: any user name, the token as password; read-only pages only.
        for path in ("/ui", "/", "/status"):
            assert _get(url + path, basic=f"me:{token}")[0] == 200, path
            assert _get(url + path, basic="me:wrong")[0] == 401, path
        assert _get(url + "/ui", basic=token)[0] == 401  # no colon: not basic credentials
        assert _get(url + "/druid/worker/v1/shuffle/tasks", basic=f"me:{token}")[0] == 401
        assert _get(url + "/druid/worker/v1/shuffle/tasks", token)[0] == 200


def test_page_names_its_daemon_and_shows_the_file_system_apart_from_ours(
        held: tuple[str, list[Path]]) -> None:
    url, locations = held
    port = url.rsplit(":", 1)[1]
    html = _get(url + "/ui")[2]
    assert f"{socket.gethostname()} (127.0.0.1:{port})" in html
    assert f"<title>shuffled {socket.gethostname()} (127.0.0.1:{port}) status" in html
    total, _, free = shutil.disk_usage(locations[0])
    used = total - free  # what this daemon cannot have: files, and blocks kept in reserve
    # Our bytes and the other files' are two widths of the file system's bar: together
    # they are the file system's use, so a disk other files fill never looks empty.
    widths = re.findall(r'class="fill ours" style="width:([\d.]+)%"></div>'
                        r'<div class="fill others[ hi]*" style="width:([\d.]+)%"', html)
    assert len(widths) == len(locations)
    for ours, others in widths:
        assert float(ours) < 1.0  # a few KiB of partials
        assert abs(float(ours) + float(others) - 100 * used / total) < 2.0, (ours, others)


def test_a_full_disk_of_other_files_does_not_look_empty() -> None:
    from shuffled.server.routes.ui import fill
    from shuffled.storage import Location

    gib = 1 << 30
    loc = Location(0, Path("/data"), None, 0)
    loc.used_bytes = 2 * gib
    share = fill(loc, (252 * gib, 73 * gib))  # a disk seen in practice: 73 of 252 GiB free
    assert share["used"] == pytest.approx(179 / 252)
    assert share["ours"] == pytest.approx(2 / 252) and share["cap"] == -1
    assert share["ours"] + share["others"] == pytest.approx(179 / 252)
    loc.max_bytes = 8 * gib
    assert fill(loc, (252 * gib, 73 * gib))["cap"] == pytest.approx(0.25)


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


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                    "(make sysdeps-test installs it)")
def test_chromium_signs_in_with_the_token_as_basic_auth(tmp_path: Path) -> None:
    """With auth on, a browser without credentials shows nothing of the page (it asks for
    a user name and password, answering the basic-auth challenge); given the token as
    basic auth (here in the URL, as a user would type it into the browser's
    prompt) it shows the status page."""
    token = secrets.token_urlsafe(24)  # generated per run
    with EmbeddedDaemon([tmp_path / "l"], free_space_reserve=0, auth_token=token) as url:
        flags = [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
        refused = subprocess.run([*flags, "--dump-dom", url + "/ui"], capture_output=True,
                                 text=True, timeout=120, check=True).stdout
        # Headless, nobody answers the browser's sign-in prompt: nothing of the page shows.
        assert 'id="locations"' not in refused and "disk" not in refused
        signed = url.replace("http://", f"http://status:{token}@")
        dom = subprocess.run([*flags, "--dump-dom", signed + "/ui"], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        assert 'id="locations"' in dom and str(tmp_path / "l") in dom, dom[:2000]
        assert 'id="where"' in dom
