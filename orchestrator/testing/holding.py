"""Holding model calls at the scripted server (`ScriptedServer.holding`), so a test keeps a call
in flight for exactly as long as it needs: a cancel, a frozen worker, a look at a run mid-step.
A delay the test hopes is long enough is a race on a loaded machine; a hold is a condition.

    server.holding.hold("writer")   # calls for model "writer" wait, once logged as requests
    wait_until(lambda: server.requests_for(run_id), what="the call to be in flight")
    ...                             # whatever must happen while the call is in flight
    server.holding.release()        # every held call answers, as scripted

A held call waits at most `limit` seconds, then answers anyway: a test that never releases fails
on what it asserts, not by hanging its worker's thread for ever. Release before the client's own
timeout (RATCHET_MODEL_TIMEOUT): a client that gave up has no call in flight any more, though
the server still holds its request.
"""

from __future__ import annotations

import threading

#: The longest a call waits for `release`.
HOLD_LIMIT_S = 60.0


class Holding:
    """Which models' calls wait, and the event that lets them go. Thread-safe."""

    def __init__(self, limit: float = HOLD_LIMIT_S) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._models: frozenset[str] | None = frozenset()  # None: every model
        self._released = threading.Event()

    def hold(self, *models: str) -> None:
        """From now on, calls for `models` (every model when none is named) wait for `release`."""
        with self._lock:
            self._models = frozenset(models) if models else None
            self._released = threading.Event()

    def release(self) -> None:
        """Let every held call answer, and hold no more."""
        with self._lock:
            self._models = frozenset()
            self._released.set()

    def wait(self, model: str) -> None:
        """The server's side, for each call once it is logged: wait while `model` is held."""
        with self._lock:
            held = self._models is None or model in self._models
            released = self._released
        if held:
            released.wait(self.limit)
