"""What a browser gets at the status page with auth on and no credentials: a basic-auth
challenge, which makes it ask for a user name and password itself (a browser cannot send a
bearer token), and a page saying what to type. The check is in the auth middleware."""

from __future__ import annotations

from aiohttp import web

from shuffled import __version__

_PAGE = f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>shuffled status: token needed</title>
<style>body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}</style></head><body>
<h1>shuffled {__version__}</h1>
<p id=login>This daemon requires its token. Sign in with any user name and the daemon's
token (the contents of its <code>auth_token_file</code>) as the password.</p>
<p>Scripts send <code>Authorization: Bearer TOKEN</code> instead (docs/ops.md).</p>
</body></html>
"""


def login_page() -> web.Response:
    """401 with ``WWW-Authenticate: Basic`` and :data:`_PAGE` (HTML, not a JSON error)."""
    response = web.Response(status=401, text=_PAGE, content_type="text/html", charset="utf-8")
    response.headers["WWW-Authenticate"] = 'Basic realm="shuffled status", charset="UTF-8"'
    return response
