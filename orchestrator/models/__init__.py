"""Model adapters: the OpenAI APIs through the official client, and Gemini through Google's SDK.

`Gemini` is loaded on first use (`from orchestrator.models import Gemini`), so importing Ratchet
never imports `google.genai`. The scripted model for tests is a test double and lives in
`orchestrator.testing.scripted_model`, so importing Ratchet never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.models.base import CallContext, Model, ModelReply, RateLimit, ToolSpec
from orchestrator.models.fallback import FallbackConfig
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses

if TYPE_CHECKING:
    from orchestrator.models.gemini import Gemini

__all__ = [
    "CallContext",
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
    """The adapters of optional SDKs, imported when first named."""
    if name == "Gemini":
        from orchestrator.models.gemini import Gemini

        return Gemini
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
