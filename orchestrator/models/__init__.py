"""Model adapters: the OpenAI APIs, Anthropic's Messages API and Gemini, each through its
vendor's official SDK.

`Claude` and `Gemini` are looked up on first use (`from orchestrator.models import Claude`), so
importing Ratchet never imports their modules; their SDKs (the `ratchet-agents[anthropic]` and
`ratchet-agents[gemini]` extras) are imported only when a call is made. The scripted model for
tests is a test double and lives in `orchestrator.testing.scripted_model`, so importing Ratchet
never loads it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orchestrator.models.base import CallContext, Model, ModelReply, RateLimit, ToolSpec
from orchestrator.models.fallback import FallbackConfig
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses

if TYPE_CHECKING:
    from orchestrator.models.anthropic import Claude
    from orchestrator.models.gemini import Gemini

#: The adapters of optional SDKs, looked up on first use, and their modules.
_LAZY = {"Claude": "orchestrator.models.anthropic", "Gemini": "orchestrator.models.gemini"}

__all__ = [
    "CallContext",
    "Claude",
    "FallbackConfig",
    "Gemini",
    "Model",
    "ModelReply",
    "OpenAIChat",
    "OpenAIResponses",
    "RateLimit",
    "ToolSpec",
]


def __getattr__(name: str) -> Any:
    """An adapter of an optional SDK, imported when first named."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
