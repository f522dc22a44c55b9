"""``/ui``: a small web page over the JSON API of ``mvdb serve`` (plain HTML, CSS and JavaScript in
``mvdb/serve/ui/``, no build step and nothing fetched from elsewhere). A query box (text where the
server has a model, or a stored document's id as the query), the hits with their scores, a hit's
stored text with the matched words highlighted by their similarity (``/explain``), the per-token
table, and the database's stats.

The page and its files hold no data, so they are served without the API key (like ``/docs``);
the page sends the key the user types (``Authorization: Bearer``) with each API call. Its Content
Security Policy lets it load and call nothing but this server.
"""

from __future__ import annotations

from pathlib import Path

from fastapi.responses import Response

FOLDER = Path(__file__).parent / "ui"
FILES = {  # route -> (file, media type)
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8"),
}
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _page(body: bytes, media_type: str):
    async def page():
        return Response(body, media_type=media_type, headers=HEADERS)

    return page


def add_ui(app) -> None:
    """Serve the page at ``/ui`` (and its script and style sheet under ``/ui/``) from ``app``."""
    for route, (name, media_type) in FILES.items():
        page = _page((FOLDER / name).read_bytes(), media_type)
        page.__name__ = "ui_" + name.replace(".", "_")
        app.add_api_route(route, page, methods=["GET"], include_in_schema=False, response_class=Response)
