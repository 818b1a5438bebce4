"""An in-process worker: a real Celery worker consuming in a thread, with its sweeper thread.

For `make demo`, examples and tests of the happy paths: it runs the same tasks, settings and
failure handlers as `ratchet worker`, in this process, and sweeps as every worker does (under the
fleet's sweep lease, `orchestrator.sweeping`) unless `sweep=False`. Crash tests use worker
subprocesses.

    with EmbeddedWorker(settings):
        agent.run("hello")
"""

from __future__ import annotations

import threading

from celery import Celery
from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker
from celery.utils.nodenames import anon_nodename
from celery.worker import state

from orchestrator.routing import named_queues
from orchestrator.runtime import Runtime, uninstall
from orchestrator.settings import Settings
from workers.celery.app import create_app
from workers.celery.tasks import runner_for


class EmbeddedWorker:
    """A Celery worker (threads pool) and a sweeper running inside this process."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        concurrency: int = 4,
        sweep: bool = True,
        loglevel: str = "WARNING",
        app: Celery | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        if app is None:
            app = create_app(self.settings)
            if self.settings.broker_url.startswith(("redis://", "rediss://")):
                # The consumer notices `stop()` only when its BRPOP returns: after at most this
                # long rather than kombu's 1 s, for ten idle BRPOPs a second.
                app.conf.broker_transport_options = {**app.conf.broker_transport_options, "polling_interval": 0.1}
        self.app = app
        self.concurrency = concurrency
        self.sweep = sweep
        self.loglevel = loglevel
        self._thread: threading.Thread | None = None
        self._runtime: Runtime | None = None

    def start(self, timeout: float = 30.0) -> EmbeddedWorker:
        """Start consuming; returns once the consumer is ready."""
        # The worker's runtime is the process's: producers here publish through this app's pool.
        self._runtime = runner_for(self.app).runtime
        setup_app_for_worker(self.app, self.loglevel, None)
        s = self.settings
        # The default queues and every queue the agents of this process name: it runs them all.
        queues = [s.model_queue, s.tools_queue, s.control_queue, *sorted(named_queues())]
        self.worker = TestWorkController(
            app=self.app,
            concurrency=self.concurrency,
            hostname=anon_nodename(),
            pool="threads",
            loglevel=self.loglevel,
            logfile=None,
            ready_callback=None,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            queues=queues,
            without_sweeper=not self.sweep,
        )
        state.should_terminate = None
        self._thread = threading.Thread(target=self.worker.start, name="ratchet-embedded-worker", daemon=True)
        self._thread.start()
        if not self.worker._on_started.wait(timeout):
            raise RuntimeError(f"the embedded worker did not start within {timeout}s (broker {s.broker_url})")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Let running tasks finish, stop the worker and its sweeper (which lets the lease go)."""
        if self._thread is not None:
            state.should_terminate = 0
            hub = getattr(self.worker, "hub", None)
            if hub is not None:  # an event loop (RabbitMQ's) polls up to 10 s: wake it to see the stop
                hub.call_soon(lambda: None)
            self._thread.join(timeout)
            state.should_terminate = None
            if self._thread.is_alive():
                raise RuntimeError(f"the embedded worker did not stop within {timeout}s")
            self._thread = None
        if self._runtime is not None:
            uninstall(self._runtime)
            self._runtime = None
        self.app.close()

    def __enter__(self) -> EmbeddedWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
