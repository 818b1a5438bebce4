"""Which tracer Ratchet records with, if any: OpenTelemetry's API imported on first use, the tracer
provider looked up until one is set, and the ids a span is made with when Ratchet fixes them.

The hot path is `tracer()`: a step calls it once, and while nothing records it costs one look at
a module-level flag (without the package) or at OpenTelemetry's global provider (without one set).
"""

from __future__ import annotations

import contextvars
import importlib.util
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

#: `opentelemetry.trace` once imported; False when it is not installed; None before the first look.
_api: ModuleType | bool | None = None
#: `opentelemetry.context`, imported with it.
_context: Any = None
#: The tracer spans are made with; None while no tracer provider is set.
_tracer: Tracer | None = None
#: Nothing is ever recorded in this process: the API is not installed, or the provider set
#: records nothing (OTEL_SDK_DISABLED).
_never = False
#: The provider given to `use_tracer_provider` (None: the global one).
_provider: TracerProvider | None = None
#: The (trace id, span id) the next span made in this context takes (see `PinnedIds`).
_pinned: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("ratchet_pinned_ids", default=None)


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace Ratchet with `provider` instead of OpenTelemetry's global one (None: the global one
    again), as instrumentations take `tracer_provider=`: for an application that keeps Ratchet's
    spans apart, and for tests."""
    global _provider, _tracer, _never
    _provider, _tracer, _never = provider, None, False


def available() -> bool:
    """Whether OpenTelemetry's API is installed (found without importing it)."""
    if _api is not None:
        return isinstance(_api, ModuleType)
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError, AttributeError):  # a parent found as None in sys.modules, say
        return False


def active() -> bool:
    """Whether Ratchet records spans in this process now."""
    return tracer() is not None


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans the tracer provider still holds (a batch processor's), if Ratchet traced
    anything: for a process about to end without running exit handlers (a prefork pool process
    ends with `os._exit`)."""
    if _tracer is None:
        return
    provider = _provider if _provider is not None else api().get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis)


def tracer() -> Tracer | None:
    """The tracer, or None when nothing is recorded. The hot path: a step calls it once."""
    if _tracer is not None or _never:
        return _tracer
    return _find_tracer()


def found() -> Tracer | None:
    """The tracer as last found, without a second look for a provider (a span inside a step)."""
    return _tracer


def _find_tracer() -> Tracer | None:
    global _tracer, _never
    module = _api if _api is not None else load()
    if not isinstance(module, ModuleType):
        _never = True
        return None
    provider = _provider if _provider is not None else module.get_tracer_provider()
    if isinstance(provider, module.ProxyTracerProvider | module.NoOpTracerProvider):
        return None  # none set yet: look again next time (a global provider is set once, for good)
    found = provider.get_tracer("ratchet")
    if isinstance(found, module.NoOpTracer):
        _never = True
        return None
    _pin_ids(found)
    _tracer = found
    return found


def load() -> ModuleType | bool:
    """`opentelemetry.trace`, imported now if it was not (False: not installed)."""
    global _api, _context
    try:
        from opentelemetry import context, trace
    except ImportError:
        _api = False
    else:
        _api, _context = trace, context
    return _api


def api() -> Any:
    """`opentelemetry.trace` (only called once a tracer was found, or after `load()` found it)."""
    return _api


def context_api() -> Any:
    """`opentelemetry.context`, imported with `api()`."""
    return _context


# ---------------------------------------------------------------- fixed ids


class PinnedIds:
    """The id generator of Ratchet's tracer: the ids `pinned()` fixed for the span made in its
    block, else those of the generator it wraps (the provider's). OpenTelemetry's API takes no
    span id, and a run's span must have the one its steps, in other processes, already named as
    their parent."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate_trace_id(self) -> int:
        """The pinned trace id, else a new one."""
        ids = _pinned.get()
        return ids[0] if ids is not None else int(self.inner.generate_trace_id())

    def generate_span_id(self) -> int:
        """The pinned span id, else a new one."""
        ids = _pinned.get()
        return ids[1] if ids is not None else int(self.inner.generate_span_id())

    def is_trace_id_random(self) -> bool:
        """A pinned trace id may be one Ratchet derived from a run id: not random."""
        return _pinned.get() is None and bool(getattr(self.inner, "is_trace_id_random", lambda: False)())


def _pin_ids(found: Any) -> None:
    """Wrap the SDK tracer's id generator once (its public `id_generator`; a tracer of another
    implementation has none, and Ratchet then emits no span whose id it must fix)."""
    inner = getattr(found, "id_generator", None)
    if inner is not None and not isinstance(inner, PinnedIds):
        found.id_generator = PinnedIds(inner)


def pins_ids() -> bool:
    """Whether the tracer makes spans with ids Ratchet fixes (the OpenTelemetry SDK's does)."""
    return isinstance(getattr(_tracer, "id_generator", None), PinnedIds)


class pinned:
    """`with pinned(trace_id, span_id):` the span made in the block takes these ids."""

    def __init__(self, trace_id: int, span_id: int) -> None:
        self._ids = (trace_id, span_id)
        self._token: contextvars.Token[tuple[int, int] | None] | None = None

    def __enter__(self) -> None:
        self._token = _pinned.set(self._ids)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _pinned.reset(self._token)
