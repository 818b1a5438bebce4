# The image compose.yaml runs: ratchet-agents installed from its wheel (not editable) with the
# extras its services need (postgres, api, otel, flower, and anthropic, gemini and mcp for the
# agents' models and tools), every package at the one version constraints.txt pins, and Ratchet's examples under /app (on PYTHONPATH). Your agents' modules
# reach it from a folder compose mounts at /code (RATCHET_CODE), or from an image built FROM this
# one with your code and dependencies (docs/operations.md, "Running it for real").
# .dockerignore keeps the build context to what is copied here.

# The wheel, built by the pinned build backend.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY constraints.txt ./
RUN pip install --no-cache-dir --no-deps -c constraints.txt setuptools
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY workers ./workers
# The wheel carries the examples too (`ratchet demo`: workers.examples in pyproject.toml)
COPY examples ./examples
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# Exactly the pinned packages (--no-deps: nothing else comes in), then pip check: every
# requirement of every installed package, the extras' included, is met by them.
FROM python:3.11-slim
WORKDIR /app
COPY constraints.txt ./
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --no-deps -r constraints.txt /wheels/*.whl && pip check && rm -r /wheels && mkdir /code
COPY examples ./examples
ENV PYTHONPATH=/app PYTHONUNBUFFERED=1
USER nobody
