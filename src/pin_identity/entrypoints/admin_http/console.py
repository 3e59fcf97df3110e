"""`GET /ui/`: the operator console, static files served by `serve` itself (no build step, nothing from
elsewhere). The page holds no secret and no data: it asks for the admin token once, keeps it in the tab's
sessionStorage, and sends it as the bearer header of the JSON API calls it makes (no cookie: no CSRF surface).
So the page needs no token, and every figure it shows is an answer of `/admin/v1/...`."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response

from pin_identity.entrypoints.admin_http.problems import ProblemError, ProblemRoute

CONSOLE_DIR = Path(__file__).parent.parent / "console"  # entrypoints/console, the package data
# The page's own files, by name: nothing else under the directory (or outside it) is ever served.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
# Only the page's own script, styles and API calls; no inline script, no framing.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

console = APIRouter(tags=["console"], route_class=ProblemRoute)


def _asset(name: str) -> Response:
    if name not in ASSETS:
        raise ProblemError(404, "IDENTITY_NOT_FOUND", f"/ui/{name} does not exist")
    return FileResponse(CONSOLE_DIR / name, media_type=ASSETS[name], headers=HEADERS)


@console.get("/ui", include_in_schema=False)
def console_root() -> Response:
    return RedirectResponse("/ui/")


@console.get(
    "/ui/",
    response_class=FileResponse,
    responses={200: {"content": {"text/html": {}}, "description": "The console's page"}},
)
def operator_console() -> Response:
    """The operator console (HTML) for the admin routes; the token is entered once in the page."""
    return _asset("index.html")


@console.get("/ui/{name}", include_in_schema=False)
def console_asset(name: str) -> Response:
    return _asset(name)
