"""Ratchet: durable LLM agents and teams on Celery.

    from orchestrator import Agent, Team, RunStatus, Client, tool
    from orchestrator.models import OpenAIResponses, OpenAIChat

This package is the domain and its store; it never imports Celery (see `workers/`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.batches import Batch, RunActed
    from orchestrator.client import Client, RunHandle
    from orchestrator.errors import (
        AgentNotFoundError,
        BrokerUnavailableError,
        ConfigurationError,
        DecisionConflictError,
        DecisionExpiredError,
        DecisionKindError,
        DefinitionChangedError,
        InvalidInputError,
        MemberRunError,
        ModelCallError,
        PausedToolChangedError,
        PauseTimeoutError,
        PoisonStepError,
        QueueFullError,
        RatchetError,
        RequirementNotFoundError,
        RunBusyError,
        RunConflictError,
        RunLiveError,
        RunNotContinuableError,
        RunNotFoundError,
        RunNotPausedError,
        RunTimeoutError,
        RunWaitTimeout,
        ScheduleConflictError,
        ScheduleNotFoundError,
        SessionOwnedError,
        StepTimeoutError,
        ToolArgumentsError,
        ToolBatchLimitError,
        ToolInterruptedError,
        UnresolvedHostError,
    )
    from orchestrator.events import RunEvent
    from orchestrator.messages import Message
    from orchestrator.producer import Agent, Team
    from orchestrator.requirements import Decision, RunRequirement, ToolExecution
    from orchestrator.retry import RetryPolicy
    from orchestrator.run import LogEntry, RunError, RunOutput, RunPage, RunSummary, Session
    from orchestrator.settings import Settings
    from orchestrator.status import RunStatus
    from orchestrator.store.metrics import MetricsSnapshot
    from orchestrator.store.schedule_rows import Schedule
    from orchestrator.tools import Tool, ToolContext, Toolkit, tool
    from orchestrator.usage import Metrics, Prices

__all__ = [
    "ToolExecution",
    "RunRequirement",
    "Decision",
    "RunNotPausedError",
    "RequirementNotFoundError",
    "PauseTimeoutError",
    "PausedToolChangedError",
    "DecisionKindError",
    "DecisionExpiredError",
    "DecisionConflictError",
    "DefinitionChangedError",
    "Agent",
    "AgentNotFoundError",
    "Batch",
    "BrokerUnavailableError",
    "Client",
    "ConfigurationError",
    "InvalidInputError",
    "LogEntry",
    "MemberRunError",
    "Message",
    "Metrics",
    "MetricsSnapshot",
    "ModelCallError",
    "PoisonStepError",
    "Prices",
    "QueueFullError",
    "RatchetError",
    "RetryPolicy",
    "RunActed",
    "RunBusyError",
    "RunConflictError",
    "RunError",
    "RunEvent",
    "RunHandle",
    "RunLiveError",
    "RunNotContinuableError",
    "RunNotFoundError",
    "RunOutput",
    "RunPage",
    "RunStatus",
    "RunSummary",
    "RunTimeoutError",
    "RunWaitTimeout",
    "Schedule",
    "ScheduleConflictError",
    "ScheduleNotFoundError",
    "Session",
    "SessionOwnedError",
    "Settings",
    "StepTimeoutError",
    "Team",
    "Tool",
    "ToolArgumentsError",
    "ToolBatchLimitError",
    "ToolContext",
    "Toolkit",
    "ToolInterruptedError",
    "UnresolvedHostError",
    "tool",
]
__version__ = "0.1.0"

#: Where each public name lives. They are imported when first asked for (PEP 562), not with the
#: package: `import orchestrator.errors` alone, as every `ratchet` command and worker process does
#: first, would otherwise import the whole domain, its store and SQLAlchemy with it.
_HOMES: dict[str, str] = {
    "Client": "orchestrator.client",
    "RunHandle": "orchestrator.client",
    "AgentNotFoundError": "orchestrator.errors",
    "BrokerUnavailableError": "orchestrator.errors",
    "ConfigurationError": "orchestrator.errors",
    "DecisionConflictError": "orchestrator.errors",
    "DecisionExpiredError": "orchestrator.errors",
    "DecisionKindError": "orchestrator.errors",
    "DefinitionChangedError": "orchestrator.errors",
    "InvalidInputError": "orchestrator.errors",
    "MemberRunError": "orchestrator.errors",
    "ModelCallError": "orchestrator.errors",
    "PauseTimeoutError": "orchestrator.errors",
    "PausedToolChangedError": "orchestrator.errors",
    "PoisonStepError": "orchestrator.errors",
    "QueueFullError": "orchestrator.errors",
    "RunTimeoutError": "orchestrator.errors",
    "RatchetError": "orchestrator.errors",
    "RequirementNotFoundError": "orchestrator.errors",
    "RunBusyError": "orchestrator.errors",
    "RunConflictError": "orchestrator.errors",
    "RunLiveError": "orchestrator.errors",
    "UnresolvedHostError": "orchestrator.errors",
    "ScheduleConflictError": "orchestrator.errors",
    "ScheduleNotFoundError": "orchestrator.errors",
    "Schedule": "orchestrator.store.schedule_rows",
    "RunNotContinuableError": "orchestrator.errors",
    "RunNotFoundError": "orchestrator.errors",
    "RunNotPausedError": "orchestrator.errors",
    "RunWaitTimeout": "orchestrator.errors",
    "SessionOwnedError": "orchestrator.errors",
    "StepTimeoutError": "orchestrator.errors",
    "ToolArgumentsError": "orchestrator.errors",
    "ToolBatchLimitError": "orchestrator.errors",
    "ToolInterruptedError": "orchestrator.errors",
    "Batch": "orchestrator.batches",
    "RunActed": "orchestrator.batches",
    "RunEvent": "orchestrator.events",
    "Message": "orchestrator.messages",
    "Agent": "orchestrator.producer",
    "Team": "orchestrator.producer",
    "Decision": "orchestrator.requirements",
    "RunRequirement": "orchestrator.requirements",
    "ToolExecution": "orchestrator.requirements",
    "RetryPolicy": "orchestrator.retry",
    "LogEntry": "orchestrator.run",
    "RunError": "orchestrator.run",
    "RunOutput": "orchestrator.run",
    "RunPage": "orchestrator.run",
    "RunSummary": "orchestrator.run",
    "Session": "orchestrator.run",
    "Settings": "orchestrator.settings",
    "RunStatus": "orchestrator.status",
    "MetricsSnapshot": "orchestrator.store.metrics",
    "Tool": "orchestrator.tools",
    "ToolContext": "orchestrator.tools",
    "Toolkit": "orchestrator.tools",
    "tool": "orchestrator.tools",
    "Metrics": "orchestrator.usage",
    "Prices": "orchestrator.usage",
}

if not TYPE_CHECKING:  # mypy reads the imports above; a module __getattr__ would hide a typo from it

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # asked once
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
