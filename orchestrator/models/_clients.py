"""The SDK clients of a process, built once: `ClientCache`, one client per settings for each kind
(openai's here, `client_for`; anthropic's in `_claude_client`, google-genai's in `gemini`).

Building a client per call is slow, and keying by the key means a rotated key gets a fresh
client. Each client's timeout bounds a whole call, not each read (`orchestrator.models._deadline`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import openai

C = TypeVar("C")


class ClientCache(Generic[C]):
    """Clients of one kind, each kept for its API key and settings in this process: at most `limit`,
    the oldest dropped first (rotated keys, old forks; a caller still holding one keeps working).
    The pid is part of the key, so a forked worker never reuses its parent's connection pool, and
    the API key is hashed, so the cache's keys are not one more copy of it. Thread-safe: a client
    is built once, under the cache's lock."""

    def __init__(self, limit: int = 16) -> None:
        self._limit = limit
        self._clients: dict[tuple[Hashable, ...], C] = {}
        self._lock = threading.Lock()

    def get(self, api_key: str, settings: tuple[Hashable, ...], build: Callable[[], C]) -> C:
        """The client for `api_key` and `settings` (everything else that builds it), `build()` the
        first time."""
        key = (os.getpid(), hashlib.sha256(api_key.encode()).hexdigest(), *settings)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = build()
                if len(self._clients) >= self._limit:
                    self._clients.pop(next(iter(self._clients)))
                self._clients[key] = client
            return client


_openai_clients: ClientCache[openai.OpenAI] = ClientCache()


def client_for(
    base_url: str, api_key: str, timeout: float, max_retries: int, organization: str | None
) -> openai.OpenAI:
    """A cached `openai.OpenAI` for these settings in this process; `timeout` bounds a whole call."""

    def build() -> openai.OpenAI:
        import openai

        from orchestrator.models._deadline import deadline_client

        return openai.OpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            organization=organization,
            http_client=deadline_client(timeout),
        )

    return _openai_clients.get(api_key, (base_url, timeout, max_retries, organization), build)
