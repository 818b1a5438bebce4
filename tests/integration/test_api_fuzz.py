"""The HTTP API fuzzed from its own OpenAPI schema: schemathesis against a real `ratchet api`
(uvicorn in a subprocess, tokens on, a PostgreSQL database of the test's own, where a value too
large for a column is a DataError), with a fixed seed and a bounded number of examples.

Every check schemathesis has: no 5xx; each operation refuses a request without the token (401);
answers in the status, content type, headers and body its schema states; takes every request
the schema allows and refuses what it does not (422); a method a path does not take is 405 with
its `Allow`; and the stateful phase's chains of starts, reads, continues and cancels hold. The
few failures that are no disagreement between schema and server are dropped, each by name, in
tests/integration/fuzz_hooks.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.settings import Settings
from tests.conftest import make_settings
from tests.integration.test_api import AGENT, ROOT, start_api

TOKEN = "fuzz-token-3b9e1c"
#: Examples per operation and phase of the fuzzing and stateful phases: with the coverage phase
#: (some 1,200 requests that try each rule's edges, which this number does not bound) every
#: parameter's rules are reached. Six made 1,409 test cases, three 1,328: each operation is still
#: tested and the stateful phase still cancels a run it started, for a fifth less CPU.
EXAMPLES = 3
#: Half the starts name the agent the server defines (the others a generated name: a 404), so the
#: stateful phase follows the links of a run it started to its reads, continues and cancels.
#: Health checks are slow by nature (each asks the workers through the broker, Celery's inspect:
#: about a second), so they are fuzzed with fewer examples, not covered value by value.
CONFIG = f"""\
[dictionaries.agents]
values = ["{AGENT}"]

[[operations]]
include-name = "POST /runs"
parameters = {{ "body.agent" = {{ dictionary = "agents", probability = 0.5 }} }}

[[operations]]
include-name = "GET /health/checks"
phases.coverage.enabled = false
generation.max-examples = 2
"""


# About 50 s on this 2-core machine under load (schemathesis' own CPU: some 28 s, the server's 5 s):
# the bounds leave a busy CI run room.
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_api_holds_to_its_schema_under_fuzzing_with_no_server_error_and_no_request_without_a_token(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings: Settings = make_settings(pg_url, redis_url)
    server = start_api(
        settings,
        tmp_path / "api.log",
        env={"RATCHET_API_TOKENS": TOKEN, "RATCHET_WEBHOOK_SECRET": "fuzz-webhook-secret"},
    )
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(tmp_path / "schemathesis.toml"), "run",
        f"{server.url}/openapi.json", "--header", f"Authorization: Bearer {TOKEN}", "--checks", "all",
        "--seed", "22", "--max-examples", str(EXAMPLES), "--workers", "1", "--generation-database", "none",
        "--request-timeout", "10", "--no-color",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCHEMATHESIS_HOOKS": "tests.integration.fuzz_hooks"}
    try:
        # In the test's folder: whatever schemathesis keeps (reports, caches) stays out of the tree.
        fuzzed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    finally:
        server.stop()

    assert fuzzed.returncode == 0, fuzzed.stdout[-20000:] + fuzzed.stderr[-5000:]
    summary = fuzzed.stdout[fuzzed.stdout.rfind("SUMMARY") :]
    selected, tested = re.search(r"Selected: (\d+)/(\d+)", summary), re.search(r"Tested: (\d+)", summary)
    assert selected and tested and selected[1] == selected[2] == tested[1], summary  # every operation
    log = server.log.read_text()
    # It reached past the door: runs it started were read, continued and cancelled by their ids
    assert '"POST /runs HTTP/1.1" 202' in log and re.search(r'"POST /runs/[^/ ]+/cancel HTTP/1.1" 200', log)
    assert "Traceback" not in log and '" 500 ' not in log, log[-5000:]
