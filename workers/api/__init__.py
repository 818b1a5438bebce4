"""The HTTP API, served by `ratchet api` (needs the `api` extra: FastAPI and uvicorn).

`workers.api.routes.create_app()` builds the ASGI app; `workers.api.serve` runs it on uvicorn,
refusing to listen beyond 127.0.0.1 when no token is configured. Importing this package (as the
command line does) needs neither FastAPI nor uvicorn; serving does.
"""
