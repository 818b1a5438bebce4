"""Tell the benchmark that a worker subprocess is consuming: it writes its pid to
$BENCH_READY_FILE when Celery's `worker_ready` fires (imported by every bench worker module)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery.signals import worker_ready


@worker_ready.connect
def _announce(**_: Any) -> None:
    path = os.environ.get("BENCH_READY_FILE")
    if path:
        Path(path).write_text(str(os.getpid()))
