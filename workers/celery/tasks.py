"""Ratchet's Celery tasks. Each is thin: claim and run one step through `StepRunner`.

- `ratchet.model_call(run_id, seq)`  queue ratchet.model: one model call.
- `ratchet.tool_batch(run_id, seq)`  queue ratchet.tools: one tool batch, tools run concurrently.
  Either goes to the queue its agent or tool names instead (`orchestrator.routing`); one sent
  with `reroute=True` (by a producer that does not define its agent) is sent on to that queue.
- `ratchet.start_run(agent, input, session_id=None, run_id=None, stream=False, user_id=None,
  session_state=None, priority=None, webhook=None, run_timeout=None)` and
  `ratchet.continue_run(run_id, input=None, fork_key=None, run_timeout=None,
  accept_definition=None)`: for producers that send tasks by name with JSON arguments (any
  language). Both return the run_id. Both are idempotent: a start without a run_id takes one
  derived from its task id, so a redelivered message finds the run it started; a continue that
  forks a COMPLETED run derives the fork's id. Both call the run control (`orchestrator.control`)
  that `Client` calls.
- `ratchet.sweep()`: one sweeper pass under the fleet's sweep lease (`orchestrator.sweeping`), for
  `ratchet beat`, which sends it every RATCHET_SWEEP_SECONDS; it sends no task events. Workers
  sweep without it, in their main process (`workers.celery.worker.SweeperStep`).

A step that raises goes to `StepTask.on_failure`, which flushes the step's in-flight messages onto
the run's ERROR row; past its soft time limit a step fails with StepTimeoutError the same way.
A killed pool process (WorkerLostError) gets no failure handler: its message is requeued at once
and dropped by the claim while the lease lives. A hard time limit kills the process too; Celery
5.7 then calls `on_failure` in the pool's main process, which holds no claim. In both cases the
sweeper re-queues the run when its lease expires.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from billiard.common import terminate_handler_fired
from celery import Celery, Task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerShutdown, WorkerTerminate

from orchestrator.control import RunControl, derived_run_id
from orchestrator.errors import FencedError, RatchetError
from orchestrator.ports import Delivery
from orchestrator.runtime import build, install
from orchestrator.steps import StepRunner
from orchestrator.sweeping import FleetSweeper
from workers.celery.app import CONTINUE_TASK, MODEL_TASK, START_TASK, SWEEP_TASK, TOOLS_TASK

log = logging.getLogger("ratchet.worker")
_runners: dict[tuple[int, int], StepRunner] = {}
_runners_lock = threading.Lock()


def runner_for(app: Celery) -> StepRunner:
    """This process's step runner for the app (rebuilt after a fork), on the worker's runtime:
    the app's settings, with the app as the dispatcher. That runtime is installed as the
    process's, so a producer in the worker (a tool that starts a run) publishes on the app too."""
    key = (id(app), os.getpid())
    with _runners_lock:
        runner = _runners.get(key)
        if runner is None:
            from workers.celery.dispatch import CeleryDispatcher

            settings = app.ratchet_settings
            runtime = build(settings, dispatcher=CeleryDispatcher(settings, app=app))
            install(runtime)
            runner = _runners[key] = StepRunner(runtime, timeouts=(SoftTimeLimitExceeded,), stopping=_worker_stopping)
        return runner


def _worker_stopping(exc: BaseException) -> bool:
    """Whether `exc` is the worker stopping rather than a tool's own doing: Celery's warm or cold
    shutdown, or the SystemExit a prefork pool process raises when it is sent SIGTERM (as at the
    hard time limit), after which billiard's terminate handler has fired."""
    if isinstance(exc, WorkerShutdown | WorkerTerminate):
        return True
    return isinstance(exc, SystemExit) and terminate_handler_fired()


class StepTask(Task):  # type: ignore[misc]
    """Base of the step tasks: the failure handler that turns a failed step into an ERROR row."""

    acks_late = True
    reject_on_worker_lost = True
    # Expected failures (a 401, a poison step): logged by Celery in one line, no traceback.
    throws = (RatchetError,)

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        run_id, seq = _step_args(args, kwargs)
        if isinstance(exc, TimeLimitExceeded):
            # Celery 5.7 calls this for a hard time limit in the pool's main process: the killed
            # child held the claim and the in-flight messages, so there is nothing to record here
            # (and no database work belongs in the main process). The sweeper takes the run back.
            log.warning("run %s step %s: killed at the hard time limit; the sweeper will retry it", run_id, seq)
            return
        try:
            runner_for(self.app).fail_step(run_id, seq, exc, owner=_owner_of(task_id))
        except Exception:  # the sweeper still recovers the run from its lease
            log.exception("run %s step %s: the failure handler could not record the error", run_id, seq)


def _step_args(args: Any, kwargs: Any) -> tuple[str, int]:
    values = [*list(args or []), kwargs.get("run_id"), kwargs.get("seq")]
    return str(values[0]), int(values[1])


def _owner(task: Task) -> str:
    return _owner_of(task.request.id)


def _owner_of(task_id: str) -> str:
    """The claim owner of a delivery: unique per host, process and task id."""
    return f"{socket.gethostname()}:{os.getpid()}:{task_id}"


def _delivery(task: Task) -> Delivery:
    """How the step's message came, for its span: the queue it was taken from, its task id, and
    the span current now being OpenTelemetry's Celery instrumentation's, where that is on."""
    info = task.request.delivery_info or {}
    queue = info.get("routing_key") or info.get("queue")
    return Delivery(system="celery", queue=queue, message_id=task.request.id, in_delivery_span=True)


def register_tasks(app: Celery) -> None:
    """Register Ratchet's tasks on `app`: the steps, the producers' starts and continues, the sweep."""
    _register_steps(app)
    _register_control(app)
    _register_sweep(app)


def _register_steps(app: Celery) -> None:
    """The step tasks: one model call, one tool batch, each claimed and run by the step runner."""

    @app.task(name=MODEL_TASK, base=StepTask, bind=True, shared=False)
    def model_call(self: Task, run_id: str, seq: int, reroute: bool = False) -> str:
        runner = runner_for(self.app)
        if reroute and runner.reroute(run_id, int(seq), "model"):
            return "rerouted"
        try:
            return runner.model_step(run_id, int(seq), owner=_owner(self), delivery=_delivery(self))
        except FencedError as exc:
            log.info("%s", exc)
            return "fenced"

    @app.task(name=TOOLS_TASK, base=StepTask, bind=True, shared=False)
    def tool_batch(self: Task, run_id: str, seq: int, reroute: bool = False) -> str:
        runner = runner_for(self.app)
        if reroute and runner.reroute(run_id, int(seq), "tools"):
            return "rerouted"
        try:
            return runner.tool_step(run_id, int(seq), owner=_owner(self), delivery=_delivery(self))
        except FencedError as exc:
            log.info("%s", exc)
            return "fenced"

    _ = (model_call, tool_batch)


def _register_control(app: Celery) -> None:
    """The tasks producers send by name (any language): start a run, continue one."""

    # A producer's mistake (an invalid id, a conflict) is logged in one line, not as a traceback.
    @app.task(name=START_TASK, bind=True, acks_late=True, shared=False, throws=(RatchetError,))
    def start_run(
        self: Task,
        agent: str,
        input: str,
        session_id: str | None = None,
        run_id: str | None = None,
        stream: bool = False,
        user_id: str | None = None,
        session_state: dict[str, Any] | None = None,
        priority: int | None = None,
        webhook: str | None = None,
        run_timeout: float | None = None,
    ) -> str:
        if run_id is None and self.request.id:
            # Derived from the task id: a redelivery of this message returns the run it started.
            run_id = derived_run_id("celery-task", self.request.id)
        return _control(self.app).start(
            agent,
            input=input,
            session_id=session_id,
            run_id=run_id,
            stream=stream,
            user_id=user_id,
            session_state=session_state,
            priority=priority,
            webhook=webhook,
            run_timeout=run_timeout,
        )

    @app.task(name=CONTINUE_TASK, bind=True, acks_late=True, shared=False, throws=(RatchetError,))
    def continue_run(
        self: Task,
        run_id: str,
        input: str | None = None,
        fork_key: str | None = None,
        run_timeout: float | None = None,
        accept_definition: str | dict[str, str] | None = None,
    ) -> str:
        return _control(self.app).continue_run(
            run_id, input=input, fork_key=fork_key, run_timeout=run_timeout, accept_definition=accept_definition
        )

    _ = (start_run, continue_run)


def _register_sweep(app: Celery) -> None:
    """Beat's sweep: one pass under the fleet's sweep lease, or none while another sweeper holds it.

    It sends no task events (`send_events=False`): every RATCHET_SWEEP_SECONDS, 17,280 a day at
    the default, they would push the steps out of Flower's 10,000 kept tasks. The lease is taken
    under an owner of this delivery's own and let go at the end of the pass."""

    @app.task(name=SWEEP_TASK, bind=True, shared=False, send_events=False)
    def sweep(self: Task) -> dict[str, list[str]]:
        fleet = FleetSweeper(runner_for(self.app), owner=f"beat:{_owner(self)}", announce=False)
        try:
            report = fleet.sweep()
        finally:
            fleet.release()
        if report is None:
            return {"skipped": ["another sweeper holds the sweep lease"]}
        return report.acted()

    _ = sweep


def _control(app: Celery) -> RunControl:
    """Run control over this process's step runner: its store, and its dispatcher on `app`."""
    runner = runner_for(app)
    return RunControl(runner.store, runner.settings, runner.dispatcher, limiter=runner.runtime.limiter)
