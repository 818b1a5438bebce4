"""The openai clients of a process: one per (base URL, key, timeout, retries, organization).

Building a client per call is slow, and keying by the key means a rotated key gets a fresh
client. Each client's timeout bounds a whole call, not each read (`orchestrator.models._deadline`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

_MAX_CLIENTS = 16
_clients: dict[tuple[Any, ...], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def client_for(
    base_url: str, api_key: str, timeout: float, max_retries: int, organization: str | None
) -> openai.OpenAI:
    """A cached `openai.OpenAI` for these settings in this process; `timeout` bounds a whole call."""
    import openai

    from orchestrator.models._deadline import deadline_client

    # The pid keeps a forked worker from reusing its parent's connection pool; the key is hashed
    # so the cache's keys are not one more copy of it.
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    key = (os.getpid(), base_url, digest, timeout, max_retries, organization)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = openai.OpenAI(
                api_key=api_key,
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
                organization=organization,
                http_client=deadline_client(timeout),
            )
            if len(_clients) >= _MAX_CLIENTS:
                # Drop the oldest (rotated keys, old forks); a caller still holding it keeps working.
                _clients.pop(next(iter(_clients)))
            _clients[key] = client
        return client
