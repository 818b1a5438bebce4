"""Model adapters: the OpenAI APIs and Anthropic's Messages API, each through its official client.

`Claude` is looked up on first use (`from orchestrator.models import Claude`), so importing
Ratchet never imports its module; the `anthropic` SDK itself (the `ratchet-agents[anthropic]`
extra) is imported only when a call is made.

The scripted model for tests is a test double and lives in `orchestrator.testing.scripted_model`, so
importing Ratchet never loads it.
"""

from typing import TYPE_CHECKING, Any

from orchestrator.models.base import CallContext, Model, ModelReply, RateLimit, ToolSpec
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses

if TYPE_CHECKING:
    from orchestrator.models.anthropic import Claude

#: The adapters looked up on first use, and their modules.
_LAZY = {"Claude": "orchestrator.models.anthropic"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CallContext",
    "Claude",
    "Model",
    "ModelReply",
    "OpenAIChat",
    "OpenAIResponses",
    "RateLimit",
    "ToolSpec",
]
