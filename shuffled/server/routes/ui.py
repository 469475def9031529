"""The status page (``GET /ui``, and ``/``): one server-rendered HTML page for operators.

What an operator looks at before opening Grafana: each location's fill level, reserve and
health; the tasks held (the largest :data:`MAX_TASKS` by bytes, so a daemon holding 100k
tasks still answers at once) with partials, last access, time to expiry and state; the
last sweeps and their outcome; version, uptime, machine and address. No JavaScript: a
meta refresh every :data:`REFRESH` seconds. Every value is HTML-escaped. With auth on it
takes the bearer token, or HTTP basic auth with the token as the password, which a
browser asks for itself (:mod:`.login`, docs/ops.md).
"""

from __future__ import annotations

import heapq
import socket
import time
from typing import Any
from html import escape

from aiohttp import web

from shuffled import __version__
from shuffled.cleanup.sweeper import SweepRecord
from shuffled.protocol import TaskDataState
from shuffled.server.state import DaemonState, state_of
from shuffled.server.routes.views import disk_usages
from shuffled.storage import Location, Quota, TaskEntry

MAX_TASKS = 200
REFRESH = 10
_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;min-width:60%} td,th{padding:.25em .7em;text-align:left;
border-bottom:1px solid #ddd} th{background:#f4f4f4} td.n{text-align:right;white-space:nowrap;
font-variant-numeric:tabular-nums} .bar{width:12em;height:.9em;background:#eee;
border:1px solid #bbb;display:flex} .fill{height:100%} .ours{background:#27a}
.others{background:#aab} .others.hi{background:#d84}
.bad{color:#b00;font-weight:bold} .ok{color:#070} .meta{color:#666}
"""


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fill(loc: Location, usage: tuple[int, int]) -> dict[str, float]:
    """What a location's bar shows, as shares of the file system (0..1): ``ours`` (the
    partials this daemon holds) and ``others`` (everything else not free to this daemon:
    other files, and blocks the file system keeps in reserve), so a disk filled by
    others never looks empty; ``used`` their sum; ``cap``, our bytes against
    ``max_bytes`` when one is set (-1 without)."""
    total, free = usage
    if total <= 0:
        return {"ours": 0.0, "others": 0.0, "used": 0.0, "cap": -1.0}
    used = max(0, total - free)
    ours = min(loc.used_bytes, used) / total
    return {"ours": ours, "others": max(0.0, used / total - ours), "used": used / total,
            "cap": min(1.0, loc.used_bytes / loc.max_bytes) if loc.max_bytes else -1.0}


def _location_row(loc: Location, usage: tuple[int, int]) -> str:
    total, free = usage
    share = fill(loc, usage)
    health = ('<span class="ok">healthy</span>' if loc.healthy else
              f'<span class="bad">unhealthy</span> {escape(str(loc.last_error or ""))}')
    title = (f"file system {share['used']:.0%} not free: shuffled {share['ours']:.1%}, "
             f"other files and reserved blocks {share['others']:.1%}")
    bar = (f'<div class="bar" title="{title}"><div class="fill ours" '
           f'style="width:{share["ours"] * 100:.1f}%"></div><div class="fill others'
           f'{" hi" if share["used"] > .85 else ""}" style="width:{share["others"] * 100:.1f}%">'
           f"</div></div>")
    disk = (f"{_bytes(total - free)} of {_bytes(total)} ({share['used']:.0%})"
            if total > 0 else "?")
    cap = (f"{_bytes(loc.max_bytes)} ({share['cap']:.0%} used)" if loc.max_bytes
           else "none")
    return (f"<tr><td><code>{escape(str(loc.path))}</code></td><td>{bar}</td>"
            f'<td class="n ours-bytes">{_bytes(loc.used_bytes)}</td>'
            f'<td class="n">{disk}</td>'
            f'<td class="n">{_bytes(free) if free >= 0 else "?"}</td>'
            f'<td class="n">{cap}</td>'
            f'<td class="n">{_bytes(loc.reserve_bytes)}</td><td class="n">{loc.files}</td>'
            f"<td>{health}</td></tr>")


def _quota(entry: TaskEntry, quota: Quota) -> str:
    if not quota.bytes and not quota.partials:
        return "none"
    parts = []
    if quota.bytes:
        parts.append(f"{entry.bytes / quota.bytes:.0%} of {_bytes(quota.bytes)}")
    if quota.partials:
        parts.append(f"{entry.files / quota.partials:.0%} of {quota.partials} partials")
    return ", ".join(parts)


def _task_row(entry: TaskEntry, state: TaskDataState, now: float, timeout: float,
              quota: Quota) -> str:
    left = entry.last_access + timeout - now
    return (f"<tr><td><code>{escape(entry.supervisor_task_id)}</code></td><td>{state}</td>"
            f'<td class="n">{_bytes(entry.bytes)}</td><td class="n">{entry.files}</td>'
            f'<td class="n">{entry.partitions}</td><td class="n">{_ago(now - entry.last_access)} ago</td>'
            f'<td class="n">{"expired" if left < 0 else "in " + _ago(left)}</td>'
            f'<td class="n">{_quota(entry, quota)}</td></tr>')


def _sweep_row(record: SweepRecord, now: float) -> str:
    outcome = (f'<span class="bad">failed: {escape(record.failure)}</span>' if record.failure
               else ('<span class="bad">' if record.errors else '<span class="ok">')
               + f"{record.errors} errors</span>")
    return (f'<tr><td class="n">{_ago(now - record.finished)} ago</td>'
            f'<td class="n">{record.seconds * 1000:.0f} ms</td><td class="n">{record.expired}</td>'
            f'<td class="n">{record.extended}</td><td class="n">{record.deleted}</td>'
            f"<td>{outcome}</td></tr>")


def _deep_line(deep: Any) -> str:
    """Deep storage's figures (nothing without it)."""
    if deep is None:
        return ""
    st = deep.stats
    return (f"<p class=meta id=deep>deep storage {escape(deep.tier.uri)}: "
            f"{_bytes(st.offloaded_bytes)} offloaded, {_bytes(st.evicted_bytes)} evicted "
            f"({st.spilled_packs} packs spilled), {_bytes(st.read_bytes)} read back, "
            f"{deep.pending} tasks pending, {st.errors} errors</p>")


def render(state: DaemonState, usages: list[tuple[int, int]], task_states: dict[str, TaskDataState],
           now: float, where: str = "") -> str:
    """The page's HTML (``usages``: (file system bytes, free bytes) per location;
    ``where``: the machine and the address this page was served from)."""
    store, settings = state.store, state.settings
    tasks = store.tasks()
    shown = heapq.nlargest(MAX_TASKS, tasks, key=lambda t: t.bytes)
    sweeper = state.sweeper
    sweeps = list(reversed(sweeper.history)) if sweeper is not None else []
    head = (f"<h1>shuffled {escape(__version__)}"
            + (f" on <span id=where>{escape(where)}</span>" if where else "")
            + f"</h1><p class=meta>up {_ago(time.time() - state.started)}"
            f" &middot; {len(tasks)} tasks &middot; {sum(t.files for t in tasks)} partials &middot; "
            f"{_bytes(sum(t.bytes for t in tasks))} held &middot; uploads {state.uploads.active}, "
            f"downloads {state.downloads.active} in flight"
            + (' &middot; <span class="bad">draining</span>' if state.drain.draining else "")
            + "</p>" + _deep_line(store.deep))
    locs = "".join(_location_row(loc, u) for loc, u in zip(store.locations, usages))
    rows = "".join(_task_row(t, task_states.get(t.supervisor_task_id, TaskDataState.RUNNING),
                             now, settings.expiry_timeout,
                             store.admission.of(t.supervisor_task_id)) for t in shown)
    more = (f"<p class=meta>and {len(tasks) - len(shown)} more (smaller) tasks: "
            f"<code>GET /druid/worker/v1/shuffle/tasks</code> lists all</p>"
            if len(tasks) > len(shown) else "")
    sweep_rows = "".join(_sweep_row(r, now) for r in sweeps) or (
        '<tr><td colspan=6 class=meta>no sweep yet (every '
        f"{settings.sweep_period:g} s; expiry after {settings.expiry_timeout:g} s)</td></tr>")
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><meta http-equiv=refresh content="{REFRESH}">
<title>shuffled {escape(where)} status</title><style>{_STYLE}</style></head><body>
{head}
<h2>Locations</h2>
<p class=meta>The bar is the location's file system: <span style="color:#27a">&#9632;</span>
this daemon's partial segments, <span style="color:#889">&#9632;</span> other files and
space the file system keeps in reserve (not free to this daemon).</p>
<table id=locations><tr><th>path</th><th>file system</th><th>shuffled holds</th>
<th>file system not free</th><th>free</th><th>max size</th><th>reserve</th><th>partials</th>
<th>health</th></tr>{locs}</table>
<h2>Tasks</h2>
<table id=tasks><tr><th>supervisor task</th><th>state</th><th>bytes</th><th>partials</th>
<th>partitions</th><th>last access</th><th>expiry</th><th>quota used</th></tr>{rows}</table>{more}
<h2>Last sweeps</h2>
<table id=sweeps><tr><th>finished</th><th>took</th><th>expired</th><th>extended</th>
<th>deleted</th><th>outcome</th></tr>{sweep_rows}</table>
<p class=meta>JSON: <a href="/status">/status</a> &middot; metrics: <a href="/metrics">/metrics</a></p>
</body></html>
"""


def _where(request: web.Request) -> str:
    """``host (address:port)``: which daemon this is, when several run on one machine."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not sockname:
        return socket.gethostname()
    address = f"[{sockname[0]}]" if ":" in sockname[0] else sockname[0]
    return f"{socket.gethostname()} ({address}:{sockname[1]})"


async def page(request: web.Request) -> web.Response:
    """``GET /ui`` and ``GET /``: the status page."""
    state = state_of(request)
    store = state.store

    states = {e.supervisor_task_id: store.state(e.supervisor_task_id) for e in store.tasks()}
    html = render(state, await store.run(disk_usages, store.locations), states, store.clock(),
                  where=_where(request))
    return web.Response(text=html, content_type="text/html", charset="utf-8")

