"""Ratchet: durable LLM agents and teams on Celery.

    from orchestrator import Agent, Team, RunStatus, Client, tool
    from orchestrator.models import OpenAIResponses, OpenAIChat

This package is the domain and its store; it never imports Celery (see `workers/`).
"""

from orchestrator.client import Client, RunHandle
from orchestrator.errors import (
    AgentNotFoundError,
    BrokerUnavailableError,
    ConfigurationError,
    DecisionConflictError,
    DecisionExpiredError,
    DecisionKindError,
    InvalidInputError,
    MemberRunError,
    ModelCallError,
    PauseTimeoutError,
    PoisonStepError,
    RatchetError,
    RequirementNotFoundError,
    RunBusyError,
    RunConflictError,
    RunLiveError,
    RunNotContinuableError,
    RunNotFoundError,
    RunNotPausedError,
    RunWaitTimeout,
    ScheduleConflictError,
    ScheduleNotFoundError,
    SessionOwnedError,
    StepTimeoutError,
    ToolArgumentsError,
    ToolBatchLimitError,
    ToolInterruptedError,
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
    "DecisionKindError",
    "DecisionExpiredError",
    "DecisionConflictError",
    "Agent",
    "AgentNotFoundError",
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
    "RatchetError",
    "RetryPolicy",
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
    "tool",
]
__version__ = "0.1.0"
