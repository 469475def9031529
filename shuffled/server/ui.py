"""The status page (``GET /ui``, and ``/``): one server-rendered HTML page for operators.

What an operator looks at before opening Grafana: each location's fill level, reserve and
health; the tasks held (the largest :data:`MAX_TASKS` by bytes, so a daemon holding 100k
tasks still answers at once) with partials, last access, time to expiry and state; the
last sweeps and their outcome; version and uptime. No JavaScript: a meta refresh every
:data:`REFRESH` seconds. Every value is HTML-escaped. It follows the auth rules of
``/status`` (the bearer token when auth is on).
"""

from __future__ import annotations

import heapq
import time
from html import escape

from aiohttp import web

from shuffled import __version__
from shuffled.cleanup.sweeper import SweepRecord
from shuffled.server.state import DaemonState, state_of
from shuffled.server.views import disk_usages
from shuffled.server.waiters import WATCH
from shuffled.storage import Location, TaskEntry

MAX_TASKS = 200
REFRESH = 10
_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;min-width:60%} td,th{padding:.25em .7em;text-align:left;
border-bottom:1px solid #ddd} th{background:#f4f4f4} td.n{text-align:right;
font-variant-numeric:tabular-nums} .bar{width:12em;height:.9em;background:#eee;
border:1px solid #bbb} .fill{height:100%;background:#4a8} .hi{background:#d84}
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


def _location_row(loc: Location, usage: tuple[int, int]) -> str:
    total, free = usage
    capacity = loc.max_bytes or total
    share = min(1.0, loc.used_bytes / capacity) if capacity and capacity > 0 else 0.0
    health = ('<span class="ok">healthy</span>' if loc.healthy else
              f'<span class="bad">unhealthy</span> {escape(str(loc.last_error or ""))}')
    return (f"<tr><td><code>{escape(str(loc.path))}</code></td>"
            f'<td><div class="bar" title="{share:.0%}"><div class="fill{" hi" if share > .85 else ""}"'
            f' style="width:{share * 100:.1f}%"></div></div></td>'
            f'<td class="n">{_bytes(loc.used_bytes)}</td>'
            f'<td class="n">{_bytes(capacity) if capacity and capacity > 0 else "?"}</td>'
            f'<td class="n">{_bytes(free) if free >= 0 else "?"}</td>'
            f'<td class="n">{_bytes(loc.reserve_bytes)}</td><td class="n">{loc.files}</td>'
            f"<td>{health}</td></tr>")


def _task_row(entry: TaskEntry, state: str, now: float, timeout: float) -> str:
    left = entry.last_access + timeout - now
    return (f"<tr><td><code>{escape(entry.supervisor_task_id)}</code></td><td>{state}</td>"
            f'<td class="n">{_bytes(entry.bytes)}</td><td class="n">{entry.files}</td>'
            f'<td class="n">{entry.partitions}</td><td class="n">{_ago(now - entry.last_access)} ago</td>'
            f'<td class="n">{"expired" if left < 0 else "in " + _ago(left)}</td></tr>')


def _sweep_row(record: SweepRecord, now: float) -> str:
    outcome = (f'<span class="bad">failed: {escape(record.failure)}</span>' if record.failure
               else ('<span class="bad">' if record.errors else '<span class="ok">')
               + f"{record.errors} errors</span>")
    return (f'<tr><td class="n">{_ago(now - record.finished)} ago</td>'
            f'<td class="n">{record.seconds * 1000:.0f} ms</td><td class="n">{record.expired}</td>'
            f'<td class="n">{record.extended}</td><td class="n">{record.deleted}</td>'
            f"<td>{outcome}</td></tr>")


def render(state: DaemonState, usages: list[tuple[int, int]], task_states: dict[str, str],
           now: float) -> str:
    """The page's HTML (``usages``: (file system bytes, free bytes) per location)."""
    store, settings = state.store, state.settings
    tasks = store.tasks()
    shown = heapq.nlargest(MAX_TASKS, tasks, key=lambda t: t.bytes)
    sweeper = state.sweeper
    sweeps = list(reversed(sweeper.history)) if sweeper is not None else []
    head = (f"<h1>shuffled {escape(__version__)}</h1><p class=meta>up {_ago(time.time() - state.started)}"
            f" &middot; {len(tasks)} tasks &middot; {sum(t.files for t in tasks)} partials &middot; "
            f"{_bytes(sum(t.bytes for t in tasks))} held &middot; uploads {state.uploads.active}, "
            f"downloads {state.downloads.active} in flight"
            + (' &middot; <span class="bad">draining</span>' if state.drain.draining else "")
            + "</p>")
    locs = "".join(_location_row(loc, u) for loc, u in zip(store.locations, usages))
    rows = "".join(_task_row(t, task_states.get(t.supervisor_task_id, "running"), now,
                             settings.expiry_timeout) for t in shown)
    more = (f"<p class=meta>and {len(tasks) - len(shown)} more (smaller) tasks: "
            f"<code>GET /druid/worker/v1/shuffle/tasks</code> lists all</p>"
            if len(tasks) > len(shown) else "")
    sweep_rows = "".join(_sweep_row(r, now) for r in sweeps) or (
        '<tr><td colspan=6 class=meta>no sweep yet (every '
        f"{settings.sweep_period:g} s; expiry after {settings.expiry_timeout:g} s)</td></tr>")
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><meta http-equiv=refresh content="{REFRESH}">
<title>shuffled status</title><style>{_STYLE}</style></head><body>
{head}
<h2>Locations</h2>
<table id=locations><tr><th>path</th><th>fill</th><th>used</th><th>capacity</th><th>free</th>
<th>reserve</th><th>partials</th><th>health</th></tr>{locs}</table>
<h2>Tasks</h2>
<table id=tasks><tr><th>supervisor task</th><th>state</th><th>bytes</th><th>partials</th>
<th>partitions</th><th>last access</th><th>expiry</th></tr>{rows}</table>{more}
<h2>Last sweeps</h2>
<table id=sweeps><tr><th>finished</th><th>took</th><th>expired</th><th>extended</th>
<th>deleted</th><th>outcome</th></tr>{sweep_rows}</table>
<p class=meta>JSON: <a href="/status">/status</a> &middot; metrics: <a href="/metrics">/metrics</a></p>
</body></html>
"""


async def page(request: web.Request) -> web.Response:
    state = state_of(request)
    store = state.store

    watch = request.app.get(WATCH)
    states = {}
    for entry in store.tasks():
        sup = entry.supervisor_task_id
        if watch is not None and watch.failed(sup):
            states[sup] = "failed"
        elif sup in store.seals:
            states[sup] = "sealed"
    html = render(state, await store.run(disk_usages, store.locations), states, store.clock())
    return web.Response(text=html, content_type="text/html", charset="utf-8")
