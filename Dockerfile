# The image compose.yaml runs: Ratchet and its examples under /app (on PYTHONPATH). Your agents'
# modules reach the workers from a folder compose mounts at /code, their working directory
# (RATCHET_CODE), or from an image built FROM this one with your code copied under /app and
# your dependencies installed (README, "Running it for real").
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY workers ./workers
COPY examples ./examples
RUN pip install --no-cache-dir -e '.[flower]' && mkdir /code
ENV PYTHONPATH=/app PYTHONUNBUFFERED=1
USER nobody
