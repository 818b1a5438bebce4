"""Every worker built from Ratchet's app sweeps unless told not to, and beat's sweep task sends no
task events (a worker and an event receiver prove both: test_worker_sweeping.py)."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.settings import Settings
from orchestrator.sweeping import lease_seconds
from workers.celery.app import SWEEP_TASK, SWEEPER_STEP, create_app
from workers.celery.worker import SweeperStep

BROKER = {"RATCHET_BROKER_URL": "redis://127.0.0.1:1/0"}


def worker_of(settings: Settings) -> SimpleNamespace:
    """What the step reads of the worker it is part of: the app and its settings."""
    return SimpleNamespace(app=SimpleNamespace(ratchet_settings=settings))


def test_a_worker_sweeps_by_default_and_not_when_told_not_to() -> None:
    assert SweeperStep(worker_of(Settings.from_env({}))).enabled
    assert not SweeperStep(worker_of(Settings.from_env({"RATCHET_WORKER_SWEEPS": "false"}))).enabled
    # EmbeddedWorker(sweep=False)
    assert not SweeperStep(worker_of(Settings.from_env({})), without_sweeper=True).enabled


def test_the_app_adds_the_sweeper_to_its_workers_and_its_sweep_task_sends_no_task_events() -> None:
    app = create_app(Settings.from_env(BROKER))
    try:
        assert SWEEPER_STEP in app.steps["worker"]
        assert app.tasks[SWEEP_TASK].send_events is False
        assert app.tasks["ratchet.model_call"].send_events is True
    finally:
        app.close()


def test_the_sweep_lease_lasts_three_sweeps_within_the_default_step_lease() -> None:
    settings = Settings()
    assert lease_seconds(settings) == 3 * settings.sweep_seconds <= settings.lease_seconds
