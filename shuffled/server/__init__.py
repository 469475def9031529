"""The aiohttp daemon: app factory, thin handlers, one error->HTTP mapping, auth."""

from shuffled.server.app import make_app

__all__ = ["make_app"]
