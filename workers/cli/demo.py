"""What `make demo` runs the examples in: the embedded default, no server needed.

`demo_environment()` starts an embedded worker (a real Celery worker in this process, on the
configured broker: the filesystem broker unless RATCHET_BROKER_URL says otherwise) and,
unless OPENAI_API_KEY is set, the project's scripted OpenAI-compatible server, pointing
OPENAI_BASE_URL at it. With OPENAI_API_KEY set, the examples talk to the real OpenAI API.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from orchestrator.settings import Settings, env_secret
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from workers.celery.embedded import EmbeddedWorker

#: The key the seed's scenario B sets to force a 401; the scripted server rejects it.
DEMO_BAD_KEY = "sk-invalid-key-deliberately-broken-to-force-auth-error"
DEMO_KEY = "sk-scripted-demo"


@contextmanager
def demo_environment(script: ScriptConfig | None = None, *, quiet: bool = False) -> Iterator[Settings]:
    """Run the body with a worker and (without OPENAI_API_KEY) the scripted model."""
    with ExitStack() as stack:
        if env_secret("OPENAI_API_KEY") is None:
            server = stack.enter_context(ScriptedServer(script or ScriptConfig(reject_keys=[DEMO_BAD_KEY])))
            stack.enter_context(_env(OPENAI_BASE_URL=server.url, OPENAI_API_KEY=DEMO_KEY))
            if not quiet:
                print(f"(scripted model at {server.url}; set OPENAI_API_KEY to use the real OpenAI API)\n")
        settings = Settings.from_env()
        stack.enter_context(EmbeddedWorker(settings))
        yield settings


@contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
