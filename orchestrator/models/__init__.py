"""Model adapters: the OpenAI APIs through the official client.

The scripted model for tests is a test double and lives in `orchestrator.testing.scripted_model`, so
importing Ratchet never loads it.
"""

from orchestrator.models.base import CallContext, Model, ModelReply, RateLimit, ToolSpec
from orchestrator.models.fallback import FallbackConfig
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses

__all__ = [
    "CallContext",
    "FallbackConfig",
    "Model",
    "ModelReply",
    "OpenAIChat",
    "OpenAIResponses",
    "RateLimit",
    "ToolSpec",
]
