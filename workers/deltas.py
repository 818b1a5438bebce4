"""The delta sink on Redis: one stream per streamed run, `ratchet:deltas:{run_id}`.

Each live event is one XADD (trimmed to about RATCHET_STREAM_MAXLEN entries) sent with an EXPIRE
of RATCHET_STREAM_TTL in the same round trip, so a stream expires that long after its last write,
also when the worker that wrote it died and nothing would ever have cleaned it up.
"""

from __future__ import annotations

import redis

from orchestrator.events import RunEvent
from orchestrator.settings import Settings

KEY = "ratchet:deltas:{run_id}"


class RedisDeltaSink:
    """A `DeltaSink` (orchestrator.ports) on the broker's Redis."""

    def __init__(self, settings: Settings) -> None:
        self.client = redis.Redis.from_url(settings.broker_url)
        self.ttl = max(1, round(settings.stream_ttl))
        self.maxlen = settings.stream_maxlen

    def write(self, event: RunEvent) -> None:
        """XADD the event and renew the stream's expiry, in one round trip."""
        key = KEY.format(run_id=event.run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(key, {"e": event.model_dump_json()}, maxlen=self.maxlen, approximate=True)
        pipe.expire(key, self.ttl)
        pipe.execute()

    def read(self, run_id: str, cursor: str | None) -> tuple[list[RunEvent], str | None]:
        """The stream's entries after the entry id `cursor`, in the order written."""
        start = "-" if cursor is None else f"({cursor}"
        entries = self.client.xrange(KEY.format(run_id=run_id), min=start, max="+")
        if not entries:
            return [], cursor
        events = [RunEvent.model_validate_json(fields[b"e"]) for _, fields in entries if fields]
        last = entries[-1][0]
        return events, last.decode() if isinstance(last, bytes) else str(last)

    def wait(self, run_id: str, cursor: str | None, timeout: float) -> None:
        """Block on the stream (XREAD BLOCK, at least 1 ms) until an entry after `cursor` is there."""
        self.client.xread({KEY.format(run_id=run_id): cursor or "0-0"}, count=1, block=max(1, round(timeout * 1000)))

    def flush(self, run_id: str) -> None:
        """Nothing to do: `write` stores each event before it returns."""
