"""``shuffled tasks ls|show|rm``: what a daemon holds, by supervisor task, and removing
a task's data, without curl. Talks to each ``--shuffle-server`` through the client with
an operator token (``--auth-token-file``); one number format throughout (``1,234``)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from shuffled.errors import ShuffleError, Unauthorized


def add_parser(sub: argparse._SubParsersAction, url: Callable[[str], str]) -> None:
    parser = sub.add_parser(
        "tasks", help="list, show or remove the supervisor tasks a daemon holds",
        description="What shuffle daemons hold, by supervisor task. ls: one line per task "
                    "(partials, bytes, when it expires); show: one task's partitions and "
                    "subtasks as JSON; rm: remove tasks' data (as the supervisor's DELETE).")
    parser.add_argument("action", choices=("ls", "show", "rm"))
    parser.add_argument("task_ids", nargs="*", metavar="SUPERVISOR_TASK_ID",
                        help="the task (show: one; rm: one or more)")
    parser.add_argument("--shuffle-server", action="append", dest="shuffle_servers",
                        required=True, metavar="URL", type=url,
                        help="daemon base URL (http[s]://host:port); repeat for several")
    parser.add_argument("--auth-token-file", metavar="PATH",
                        help="an operator token (the daemons' auth_token, or `shuffled "
                             "token --scope operator --task '*'`)")
    parser.add_argument("--ca-file", metavar="PATH", help="CA bundle for https daemons")


def read_token(path: str | None) -> str | None:
    """The token in ``path`` (None without one); ValueError naming the file if unusable."""
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--auth-token-file {path} cannot be read: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise ValueError(f"--auth-token-file {path} is empty")
    return token


def run(args: argparse.Namespace, out: TextIO) -> None:
    """Carry out ``args.action`` on every server; raises ShuffleError (exit 1) or
    ValueError for arguments that do not fit the action (exit 2)."""
    token = read_token(args.auth_token_file)
    if args.action == "ls" and args.task_ids:
        raise ValueError("tasks ls takes no task id (tasks show ID shows one)")
    if args.action == "show" and len(args.task_ids) != 1:
        raise ValueError("tasks show takes exactly one supervisor task id")
    if args.action == "rm" and not args.task_ids:
        raise ValueError("tasks rm takes the supervisor task ids to remove")
    for server in args.shuffle_servers:
        try:
            _on(server, args, token, out)
        except Unauthorized as exc:
            given = (f"the token in --auth-token-file {args.auth_token_file}"
                     if token else "no token (give --auth-token-file FILE)")
            raise ShuffleError(f"{server} refused {given}: it needs an operator token (its "
                               "auth_token, or `shuffled token --scope operator --task '*'`)"
                               ) from exc


def _on(server: str, args: argparse.Namespace, token: str | None, out: TextIO) -> None:
    # Imported here: every command builds this parser, and the client (http.client, its
    # email parsing) is ~10% of `shuffled serve`'s start, which never uses it.
    from shuffled.client import ShuffleClient
    from shuffled.client.http import NO_RETRY

    with ShuffleClient(server, token=token, ca_file=args.ca_file, timeout=30.0,
                       retry=NO_RETRY) as client:
        if args.action == "ls":
            _ls(server, client.list_tasks(), out)
        elif args.action == "show":
            _show(server, args.task_ids[0], client.task(args.task_ids[0]), out)
        else:
            for sup in args.task_ids:
                _rm(server, sup, client.delete_task(sup), out)


def _ls(server: str, listing: dict[str, Any], out: TextIO) -> None:
    tasks = listing.get("tasks", [])
    now = time.time()
    print(f"{server}: {len(tasks):,} task(s), {listing.get('files', 0):,} partials, "
          f"{listing.get('bytes', 0):,} bytes", file=out)
    if not tasks:
        return
    rows = [("TASK", "PARTIALS", "BYTES", "EXPIRES IN")]
    for t in tasks:
        left = max(0, int(t.get("expiresAt", now) - now))
        rows.append((t["supervisorTaskId"], f"{t.get('files', 0):,}", f"{t.get('bytes', 0):,}",
                     f"{left // 60}m{left % 60:02d}s"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))), file=out)


def _show(server: str, sup: str, detail: dict[str, Any] | None, out: TextIO) -> None:
    if detail is None:
        raise ShuffleError(f"{server} holds no data of supervisor task {sup}")
    print(json.dumps(detail, indent=2, sort_keys=True), file=out)


def _rm(server: str, sup: str, answer: dict[str, Any], out: TextIO) -> None:
    if answer.get("deleted"):
        print(f"{server}: removed {sup}: {answer.get('files', 0):,} partials, "
              f"{answer.get('bytes', 0):,} bytes", file=out)
    else:
        print(f"{server}: {sup} was not held (nothing to remove)", file=out)
