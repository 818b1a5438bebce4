"""Model adapters: the OpenAI APIs through the official client, and a scripted model for tests."""

from orchestrator.models.base import CallContext, Model, ModelReply, ToolSpec
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses
from orchestrator.models.scripted import ScriptedModel

__all__ = ["CallContext", "Model", "ModelReply", "OpenAIChat", "OpenAIResponses", "ScriptedModel", "ToolSpec"]
