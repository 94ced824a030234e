"""The chat page of `mlxspec serve` (static/): its files and the headers they are served with.

The page (static/chat.html, chat.css, chat.js, markdown.js) runs only its own scripts and
styles and talks only to this server (the Content-Security-Policy below), so a reply that
smuggled markup past the renderer (markdown.js builds DOM nodes, never innerHTML) still could
not load or run anything.  No CDN: nothing outside the machine is fetched.
"""

from __future__ import annotations

from importlib import resources

STATIC = {"/static/chat.js": "text/javascript; charset=utf-8",  # the page's files: these names only
          "/static/markdown.js": "text/javascript; charset=utf-8",
          "/static/chat.css": "text/css; charset=utf-8"}
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff"}
_cache: dict = {}


def chat_page() -> bytes:
    return resources.files("mlxspec.server").joinpath("static", "chat.html").read_bytes()


def static_file(path: str) -> bytes:
    """One of the page's files (a STATIC path), read once."""
    if path not in _cache:
        _cache[path] = resources.files("mlxspec.server").joinpath(*path.strip("/").split("/")).read_bytes()
    return _cache[path]
