"""What the API's routes depend on: the `Client` the app serves, and the bearer token scheme
each router declares. Its own module so that the routes (`routes.py`, `records.py`,
`checks.py`) all take them from here and none imports another."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPBearer

from orchestrator.client import Client


def client_of(request: Request) -> Client:
    """The Client of the app serving `request` (`create_app` puts it in the app's state)."""
    client: Client = request.app.state.client
    return client


ClientDep = Annotated[Client, Depends(client_of)]


def token_router() -> APIRouter:
    """A router whose routes declare the bearer scheme in the OpenAPI schema, so that clients
    generated from it send the header. The token itself is checked by the Gate, before the body
    is read."""
    return APIRouter(dependencies=[Depends(HTTPBearer(auto_error=False))])
