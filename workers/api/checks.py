"""`GET /health/checks`: `ratchet health` over HTTP (`workers.health`), with the same checks,
arguments and report; 200 when every check passes, 503 when one fails.

    GET /health/checks?check=database&check=broker&check=workers&destination=model@%h&queue=...

Behind the token, unlike `GET /health` (the server is up): the report names the database, the
workers and the queues. The checks run in the API's process, with its settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Query, Request, Response
from pydantic import BaseModel, Field, WithJsonSchema

from orchestrator.errors import InvalidInputError
from orchestrator.validation import QUEUE_NAME_MAX
from workers.api.contract import CHECKS, name, pattern, refusals, texts
from workers.api.deps import token_router
from workers.health import DEFAULT_CHECKS, check_health

router = token_router()


class CheckOut(BaseModel):
    """One check: what it found, or what failed and what to do."""

    name: str
    ok: bool
    detail: str
    info: dict[str, Any] = Field(default_factory=dict, description="queue lengths, workers that answered...")


class HealthReport(BaseModel):
    """The answer of `GET /health/checks` (the same with 503 when a check failed)."""

    healthy: bool
    checks: list[CheckOut]
    detail: str | None = Field(
        default=None,
        description="503: each check that failed and what it found, where a client looks for an error's detail",
    )


@router.get(
    "/health/checks",
    operation_id="checkHealth",
    summary="Run the health checks",
    response_model=HealthReport,
    tags=["meta"],
    responses={503: {"model": HealthReport, "description": "a check failed"}, **refusals(401, 422)},
)
def health_checks(
    request: Request,
    response: Response,
    check: Annotated[
        list[str],
        texts(pattern(CHECKS)),
        Query(
            description="database, broker, workers, sweeper, beat (default: the first three); several: repeat it, or "
            "separate them with commas"
        ),
    ] = [],  # noqa: B006
    destination: Annotated[
        list[str],
        texts(name(QUEUE_NAME_MAX)),
        Query(description="only these workers must answer (%h: this host)"),
    ] = [],  # noqa: B006
    queue: Annotated[
        list[str] | None,
        texts(name(QUEUE_NAME_MAX)),
        Query(description="queues that must have a consumer"),
    ] = None,
    workers: Annotated[int, Query(ge=0)] = 1,
    timeout: Annotated[float, Query(gt=0, le=60, allow_inf_nan=False)] = 2.0,
    max_age: Annotated[
        float | None, Query(gt=0, allow_inf_nan=False), WithJsonSchema({"type": "number", "exclusiveMinimum": 0})
    ] = None,
) -> HealthReport:
    """Check the database, the broker and that workers answer, as `ratchet health` does."""
    for item in check:
        if re.fullmatch(CHECKS, item) is None:
            raise InvalidInputError(
                f"check {item[:80]!r} names no check: give database, broker, workers, sweeper or beat (several: repeat "
                "check=, or separate them with commas)"
            )
    split = [v.strip() for value in check for v in value.split(",")]
    report = check_health(
        request.app.state.client.settings,
        checks=split or DEFAULT_CHECKS,
        destinations=destination,
        queues=queue,
        workers=workers,
        timeout=timeout,
        max_age=max_age,
    )
    response.status_code = 200 if report.healthy else 503
    checks = [CheckOut(name=c.name, ok=c.ok, detail=c.detail, info=c.info) for c in report.checks]
    failed = "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)
    return HealthReport(healthy=report.healthy, checks=checks, detail=failed or None)
