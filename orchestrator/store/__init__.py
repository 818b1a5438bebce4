"""The run store: tables, migrations and the guarded reads and writes of runs and messages.

`Store` is the one interface the rest of Ratchet uses, on SQLite and PostgreSQL alike; what it
does its own way on each database is its backend's (`backend.py`, `sqlite.py`, `postgres.py`).
"""

from orchestrator.store.claims import Claim
from orchestrator.store.store import Store, forget_stores

__all__ = ["Claim", "Store", "forget_stores"]
