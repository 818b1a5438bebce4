"""The HTTP API, served by `ratchet api` (needs the `api` extra: FastAPI and uvicorn).

    from workers.api import create_app, mount

`create_app(settings, client=...)` builds the API's FastAPI app; `mount(app, "/ratchet")` serves
it inside a FastAPI app of your own, under that path, with its start in your app's lifespan
(both in `workers.api.routes`). `workers.api.serve` runs it on uvicorn (`ratchet api`), refusing
to listen beyond 127.0.0.1 when no token is configured. Importing this package (as the command
line does) needs neither FastAPI nor uvicorn; asking it for `create_app` or `mount` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.api.routes import create_app, mount

__all__ = ["create_app", "mount"]


def __getattr__(name: str) -> Any:
    """`create_app` and `mount`, imported (with FastAPI) when first asked for."""
    if name in __all__:
        from workers.api import routes

        return getattr(routes, name)
    raise AttributeError(f"module 'workers.api' has no attribute {name!r}")
