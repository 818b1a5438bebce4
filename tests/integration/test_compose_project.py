"""A project of one's own on Ratchet's stack, rendered by compose itself: tests/integration/
sample_project, whose compose.yaml includes Ratchet's with the project as its project directory.

Every service of Ratchet's file is there, unchanged but for what the project gives: the image its
Dockerfile builds (FROM Ratchet's, installing within Ratchet's constraints), its folder mounted at
/code, its agents module; an override file beside it changes a service as compose merges it.
tests/integration/test_compose_commands.py runs this rendering's commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.compose_render import COMPOSE, ROOT, SCRIPTED_ENV, render

SAMPLE = ROOT / "tests" / "integration" / "sample_project"
#: What the project's variables are (sample_project/ratchet.env).
PROJECT_APP, PROJECT_IMAGE = "myproject.agents", "myproject:local"


def importing(services: dict[str, Any]) -> list[str]:
    """The services that import the agents: the API and the workers."""
    return [s for s in services if s == "api" or s.startswith("worker-")]


def test_the_project_runs_every_service_of_ratchets_file_with_its_image_code_and_agents() -> None:
    ratchet = render([COMPOSE], {}, profiles=["*"])
    project = render([SAMPLE / "compose.yaml"], {}, profiles=["*"])
    assert project["name"] == "sample_project" and set(project["services"]) == set(ratchet["services"])
    assert project["secrets"].keys() == ratchet["secrets"].keys()
    for name, spec in project["services"].items():
        theirs = ratchet["services"][name]
        if theirs["image"].startswith(("redis:", "postgres:")):
            assert spec == theirs, name  # the servers as Ratchet runs them
            continue
        assert spec["image"] == PROJECT_IMAGE and spec["command"] == theirs["command"], name
        if "build" in theirs:  # the project's Dockerfile, in its folder
            assert spec["build"] == {"context": str(SAMPLE), "dockerfile": "Dockerfile"}, name
        assert spec.get("secrets") == theirs.get("secrets") and spec.get("ports") == theirs.get("ports"), name
        assert spec["healthcheck"] == theirs["healthcheck"], name
    for name in importing(project["services"]):
        spec = project["services"][name]
        (mount,) = spec["volumes"]
        assert (mount["source"], mount["target"], mount["read_only"]) == (str(SAMPLE), "/code", True), name
        assert spec["working_dir"] == "/code" and spec["environment"]["RATCHET_APP"] == PROJECT_APP, name
    assert (SAMPLE / "myproject" / "agents.py").is_file()  # what RATCHET_APP imports from /code


def test_the_projects_image_builds_on_ratchets_within_its_constraints() -> None:
    ours = (ROOT / "Dockerfile").read_text().splitlines()
    final = ours[max(i for i, line in enumerate(ours) if line.startswith("FROM ")) :]
    # Ratchet's image: /app holds the constraints and is on the path; ratchet:local by default
    assert "WORKDIR /app" in final and "COPY constraints.txt ./" in final and "ENV PYTHONPATH=/app" in " ".join(final)
    assert render([COMPOSE], {})["services"]["api"]["image"] == "ratchet:local"
    theirs = [line for line in (SAMPLE / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")]
    assert theirs[0] == "FROM ratchet:local" and theirs[-1] == "USER nobody"
    assert "RUN pip install --no-cache-dir -c /app/constraints.txt -r /app/requirements.txt" in theirs
    assert "COPY requirements.txt /app/requirements.txt" in theirs and "COPY myproject /app/myproject" in theirs


def test_a_variable_of_the_shell_wins_and_the_scripted_env_file_works_for_the_project_too() -> None:
    project = render([SAMPLE / "compose.yaml"], {"RATCHET_APP": "myproject.other"}, env_files=[SCRIPTED_ENV])
    services = project["services"]
    assert "model" in services and services["worker-model"]["environment"]["OPENAI_BASE_URL"] == "http://model:8765/v1"
    assert {services[s]["environment"]["RATCHET_APP"] for s in importing(services)} == {"myproject.other"}


def test_an_override_file_beside_the_projects_compose_file_changes_a_service(tmp_path: Path) -> None:
    # What a project's compose.override.yaml says: its workers run only the code the image holds,
    # more model threads, and the API's tokens from a file of its own
    override = tmp_path / "compose.override.yaml"
    override.write_text(
        "services:\n"
        "  worker-model:\n"
        "    volumes: !reset []\n"
        '    command: ["ratchet", "worker", "-Q", "ratchet.model", "-P", "threads", "-c", "100", "-n", "model@%h"]\n'
        "secrets:\n"
        "  api_tokens: !override { file: /etc/myproject/api_tokens }\n"
    )
    project = render([SAMPLE / "compose.yaml", override], {}, project_directory=SAMPLE)
    model = project["services"]["worker-model"]
    assert "volumes" not in model and model["command"][model["command"].index("-c") + 1] == "100"
    assert model["environment"]["RATCHET_APP"] == PROJECT_APP  # the rest as it was
    assert project["secrets"]["api_tokens"]["file"] == "/etc/myproject/api_tokens"
    assert project["services"]["worker-tools"]["volumes"][0]["source"] == str(SAMPLE)
