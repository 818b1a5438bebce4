# The image compose.yaml runs: Ratchet and your agents' module (mounted or copied into /app).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY workers ./workers
COPY examples ./examples
RUN pip install --no-cache-dir -e '.[flower]'
ENV PYTHONPATH=/app PYTHONUNBUFFERED=1
USER nobody
