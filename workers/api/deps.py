"""What the API's routes depend on: the `Client` the app serves, the bearer token scheme each
router declares, and the path the API is served under. Its own module so that the routes
(`routes.py`, `records.py`, `checks.py`, `ui.py`) and the gate all take them from here and none
imports another."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPBearer
from starlette.types import Scope

from orchestrator.client import Client
from workers.api.access import authorize


def client_of(request: Request) -> Client:
    """The Client of the app serving `request` (`create_app` puts it in the app's state)."""
    client: Client = request.app.state.client
    return client


ClientDep = Annotated[Client, Depends(client_of)]


def token_router() -> APIRouter:
    """A router whose routes declare the bearer scheme in the OpenAPI schema, so that clients
    generated from it send the header, and ask their caller for the route's scope
    (`access.authorize`: a route with none is refused). The token itself is checked by the Gate,
    before the body is read."""
    return APIRouter(dependencies=[Depends(HTTPBearer(auto_error=False)), Depends(authorize)])


def root_path(scope: Scope) -> str:
    """The path in front of the API's own (`ratchet api --root-path`, or where an app mounts it),
    without a trailing slash: '' when the API is served at the root."""
    return str(scope.get("root_path", "")).rstrip("/")


def route_path(scope: Scope) -> str:
    """The request's path as the routes match it: without the root path in front, as Starlette's
    router strips it (a server told `--root-path /p` sees `/p/health` for the proxy's `/health`)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root) :] if path[len(root)] == "/" else path
