"""The run pages `ratchet api` serves at /ui/, a console: a list of runs that updates itself, one
run as a timeline that streams while the run is live (a paused run's calls decided from it) and
as a time axis (its steps as a waterfall), the sessions, the agent catalog, a playground that
starts a run of a chosen agent, streams it and goes on with it, and the schedules. Files shipped
in the package (`workers/api/static/`): plain HTML, two style sheets and scripts (`app.js`: the
list, a run, the routing and the helpers the others call; `decide.js`: a person's decisions;
`schedules.js`: `#/schedules`; `batches.js`: runs of the list picked and continued or cancelled
together; `agents.js`: `#/agents`; `sessions.js`: `#/sessions`;
`timeaxis.js`: `#/runs/RUN_ID/time`; `playground.js`: `#/playground`), no build step and nothing
fetched from elsewhere.

The files hold no data, so they are served without a token (`workers.api.gate.PUBLIC_PATHS`);
the script asks for one when the API answers 401, keeps it in the tab's sessionStorage, and
sends it as `Authorization: Bearer` on every request, the event stream included (read with
fetch, since a browser's EventSource cannot send a header). The token never goes into a URL.

Run content is the model's and the tools' output, untrusted: the script writes it as text only
(`textContent`), and the page's Content-Security-Policy lets no script run but the page's own,
so an injected tag stays text even where a mistake let it through.

    GET /         redirects to /ui/
    GET /ui/      the page (index.html); its scripts and style sheets beside it (/ui/app.js, /ui/app.css...)
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from workers.api.deps import root_path

#: The files the page is made of, and their types.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "decide.js": "text/javascript; charset=utf-8",
    "schedules.js": "text/javascript; charset=utf-8",
    "agents.js": "text/javascript; charset=utf-8",
    "sessions.js": "text/javascript; charset=utf-8",
    "timeaxis.js": "text/javascript; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "batches.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
#: The paths that serve them (and redirect to them): no token needed.
PATHS = frozenset({"/", "/ui", "/ui/", *(f"/ui/{name}" for name in FILES)})
#: Only the page's own script, styles and API calls; no frames, no forms sent elsewhere.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new version of the package is served at once: the files are small, and revalidated each load.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> bytes:
    return (resources.files("workers.api") / "static" / name).read_bytes()


@router.get("/")
@router.get("/ui")
def _to_page(request: Request) -> RedirectResponse:
    # Under the root path when the server knows it (`--root-path`, a mount); else relative, which
    # is right behind a prefix it was not told of too, but for the prefix alone without its slash.
    root = root_path(request.scope)
    return RedirectResponse(f"{root}/ui/" if root else "ui/", status_code=307)


@router.get("/ui/")
def page() -> Response:
    """The page; its script shows the list of runs, or a run (`#/runs/RUN_ID`)."""
    return _served("index.html")


@router.get("/ui/{name}")
def asset(name: str) -> Response:
    """The page's script and styles."""
    if name not in FILES or name == "index.html":
        raise HTTPException(404, f"no file {name!r} in the run pages: /ui/ is the page")
    return _served(name)


def _served(name: str) -> Response:
    return Response(_file(name), media_type=FILES[name], headers=HEADERS)
