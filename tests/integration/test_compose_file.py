"""compose.yaml's promises, read from its rendering by compose itself (`docker compose config`:
tests/integration/compose_render.py): every service has a health check of its own; the secrets
reach the services that need them as files, and no container's environment holds one; Flower
needs a password the user sets; Flower and the API are published on the host's loopback unless
configured; the scripted model runs only under its profile, and only compose.scripted.env points
the workers at it; a control worker takes the control queue alone; the agents' code reaches the
workers and the API from a mounted folder, their working directory.

tests/integration/test_compose_commands.py runs the services; test_compose_project.py renders
the file for a project of one's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.integration.compose_render import COMPOSE, ROOT, SCRIPTED_ENV, env_file, render, unescaped

#: The variables compose.yaml's secrets come from, by each secret's name.
SECRETS = {"openai_api_key": "OPENAI_API_KEY", "api_tokens": "RATCHET_API_TOKENS", "flower_password": "FLOWER_PASSWORD"}
CANARY, API_TOKEN, FLOWER_PASSWORD = (f"{kind}-canary-{uuid.uuid4().hex}" for kind in ("sk", "tok", "pw"))


def rendered(env: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
    """compose.yaml as compose renders it, with these variables (no others)."""
    return render([COMPOSE], env or {}, **options)


def queues_of(spec: dict[str, Any]) -> list[str]:
    words = spec["command"]
    return words[words.index("-Q") + 1].split(",")


def workers_of(services: dict[str, Any]) -> list[str]:
    return [s for s in services if s.startswith("worker-")]


# The file's promises


def test_compose_renders_the_file_and_its_profiles_choose_the_optional_services() -> None:
    default, every = rendered()["services"], rendered(profiles=["*"])["services"]
    assert set(every) - set(default) == {"model", "worker-gpu"}
    assert (
        "model" in rendered(profiles=["scripted"])["services"]
        and "worker-gpu" in rendered(profiles=["gpu"])["services"]
    )
    # No beat: every worker sweeps (one at a time), and none is told not to
    assert "beat" not in every
    assert all("RATCHET_WORKER_SWEEPS" not in every[s]["environment"] for s in workers_of(every))
    # The services that import the agents wait for the tables and the broker
    for name in ["api", *workers_of(every)]:
        needs = {k: v["condition"] for k, v in every[name]["depends_on"].items()}
        assert needs == {"migrate": "service_completed_successfully", "redis": "service_healthy"}, name
    assert every["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_every_service_has_a_health_check_of_its_own() -> None:
    services = rendered(profiles=["*"])["services"]
    for name, spec in services.items():
        check = spec.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no health check"
        assert check["test"][0] == "CMD", name
    # Each worker's check asks that worker only (its node name) for the queue it consumes
    for name in workers_of(services):
        words, test = services[name]["command"], services[name]["healthcheck"]["test"]
        node = words[words.index("-n") + 1]
        assert test[1:5] == ["ratchet", "health", "--check", "workers"], name
        assert test[test.index("--destination") + 1] == node and node.endswith("@%h"), name
        assert test[test.index("--queue") + 1] == ",".join(queues_of(services[name])), name
    assert services["migrate"]["healthcheck"]["test"][1:] == ["ratchet", "health", "--check", "database"]
    # The API's: its liveness route, on the port it serves
    api = services["api"]
    assert api["command"][:2] == ["ratchet", "api"] and api["command"][api["command"].index("--port") + 1] == "8000"
    assert "'http://127.0.0.1:8000/health'" in api["healthcheck"]["test"][-1]


def test_flower_and_the_api_are_published_on_the_hosts_loopback_unless_configured() -> None:
    def ports(env: dict[str, str]) -> dict[str, tuple[str, str, int]]:
        services = rendered(env)["services"]
        return {s: (p["host_ip"], p["published"], p["target"]) for s in services for p in services[s].get("ports", [])}

    assert ports({}) == {"api": ("127.0.0.1", "8000", 8000), "flower": ("127.0.0.1", "5555", 5555)}
    opened = ports({"API_BIND": "0.0.0.0", "API_PORT": "8080", "FLOWER_BIND": "10.1.2.3"})
    assert opened == {"api": ("0.0.0.0", "8080", 8000), "flower": ("10.1.2.3", "5555", 5555)}


def test_the_secrets_reach_the_services_that_need_them_as_files_and_no_environment_holds_one(tmp_path: Path) -> None:
    values = {"OPENAI_API_KEY": CANARY, "RATCHET_API_TOKENS": API_TOKEN, "FLOWER_PASSWORD": FLOWER_PASSWORD}
    model = rendered(values, profiles=["*"])
    assert {k: v["environment"] for k, v in model["secrets"].items()} == SECRETS
    given = {s: [m["source"] for m in spec.get("secrets", [])] for s, spec in model["services"].items()}
    assert {s: v for s, v in given.items() if v} == {
        "api": ["api_tokens"],
        "flower": ["flower_password"],
        "worker-model": ["openai_api_key"],
        "worker-tools": ["openai_api_key"],
        "worker-gpu": ["openai_api_key"],
    }
    # Each service's *_FILE variable names its secret's file; no value is anywhere in the model
    for service, names in given.items():
        targets = {m["source"]: m["target"] for m in model["services"][service].get("secrets", [])}
        env = model["services"][service].get("environment") or {}
        for name in names:
            assert targets[name] == f"/run/secrets/{name}"
        if "api_tokens" in names:
            assert env["RATCHET_API_TOKENS_FILE"] == "/run/secrets/api_tokens"
        if "openai_api_key" in names:
            assert env["OPENAI_API_KEY_FILE"] == "/run/secrets/openai_api_key"
        assert not set(SECRETS.values()) & set(env) and "FLOWER_BASIC_AUTH" not in env, service
    assert not [v for v in values.values() if v in json.dumps(model)]
    # compose reads the file with none of them set (compose.yaml's header: set all three)
    assert rendered({}, profiles=["*"])["secrets"] == model["secrets"]
    # From a file instead: an override file, as compose.yaml's header says
    override = tmp_path / "compose.override.yaml"
    override.write_text("secrets:\n  api_tokens: !override { file: ./secrets/api_tokens }\n")
    from_file = render([COMPOSE, override], {}, project_directory=ROOT)["secrets"]["api_tokens"]
    assert from_file["file"] == str(ROOT / "secrets" / "api_tokens") and "environment" not in from_file


def test_flower_needs_a_password_the_user_sets(tmp_path: Path) -> None:
    assert not re.search(r"FLOWER_PASSWORD:?-", COMPOSE.read_text()), "a default password"
    command = [unescaped(w) for w in rendered({"FLOWER_USER": "admin"})["services"]["flower"]["command"]]
    assert command[:2] == ["sh", "-c"] and 'FLOWER_BASIC_AUTH="admin:$password" exec celery' in command[2]
    # Without its secret's file (compose makes none for an empty variable), or with an empty one,
    # Flower does not start
    secret = tmp_path / "flower_password"
    script = command[2].replace("/run/secrets/flower_password", str(secret))
    for content in (None, "", "\n"):
        if content is not None:
            secret.write_text(content)
        done = subprocess.run(
            ["sh", "-c", script], env={"PATH": os.defpath}, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 1 and "set FLOWER_PASSWORD" in done.stderr and "celery" not in done.stderr, done


def test_the_api_does_not_start_without_its_tokens(tmp_path: Path) -> None:
    # compose makes no secret file for an empty variable: `ratchet api` as compose starts it, then
    api = rendered({"RATCHET_APP": "tests.integration.compose_agents"})["services"]["api"]
    env = {k: v.replace("/run/secrets/", f"{tmp_path}/") for k, v in api["environment"].items()}
    env |= {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "workers.cli", *api["command"][1:]]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "RATCHET_API_TOKENS_FILE: cannot read" in done.stderr, done


def test_the_scripted_model_runs_only_under_its_profile_and_a_real_key_talks_to_the_real_api() -> None:
    scripted = env_file(SCRIPTED_ENV)
    assert scripted["COMPOSE_PROFILES"] == "scripted" and "model:8765" not in COMPOSE.read_text()  # only the env file
    real, tried = rendered(profiles=["*"])["services"], rendered(env_files=[SCRIPTED_ENV])["services"]
    assert real["model"]["profiles"] == ["scripted"] and "model" in tried and "worker-gpu" not in tried
    calling = sorted(s for s in real if "OPENAI_API_KEY_FILE" in (real[s].get("environment") or {}))
    assert calling == ["worker-gpu", "worker-model", "worker-tools"]
    for service in calling:
        assert real[service]["environment"]["OPENAI_BASE_URL"] == "https://api.openai.com/v1"
        if service in tried:
            assert tried[service]["environment"]["OPENAI_BASE_URL"] == "http://model:8765/v1"
    # Nothing else is given a key or a model endpoint
    for service in set(real) - set(calling):
        env = set(real[service].get("environment") or {})
        assert not {"OPENAI_API_KEY", "OPENAI_API_KEY_FILE", "OPENAI_BASE_URL"} & env, service


def test_a_control_worker_takes_the_control_queue_alone() -> None:
    services = rendered(profiles=["*"])["services"]
    assert queues_of(services["worker-control"]) == ["ratchet.control"]
    consumers = [s for s in workers_of(services) if "ratchet.control" in queues_of(services[s])]
    assert consumers == ["worker-control"]  # no start, continue or sweep waits behind a tool batch
    assert queues_of(services["worker-model"]) == ["ratchet.model"]
    assert queues_of(services["worker-tools"]) == ["ratchet.tools"]
    assert "--autoscale" not in services["worker-control"]["command"]


def test_the_users_code_reaches_the_workers_and_the_api_from_a_mounted_folder() -> None:
    theirs = rendered({"RATCHET_CODE": "/home/me/project", "RATCHET_APP": "myproject.agents"}, profiles=["*"])
    default = rendered(profiles=["*"])["services"]
    importing = [s for s in theirs["services"] if s == "api" or s.startswith("worker-")]
    for service in importing:
        spec = theirs["services"][service]
        (mount,) = spec["volumes"]
        assert (mount["type"], mount["source"], mount["target"], mount["read_only"]) == (
            "bind",
            "/home/me/project",
            spec["working_dir"],
            True,
        ), service
        assert default[service]["volumes"][0]["source"] == str(ROOT)  # by default the folder compose.yaml is in
        assert spec["environment"]["RATCHET_APP"] == "myproject.agents"
        assert "--app" not in spec["command"]  # RATCHET_APP, which `celery -A workers.celery.app worker` reads too
    assert default["api"]["environment"]["RATCHET_APP"] == "examples.team_research"
