"""The run store: tables, migrations and the guarded reads and writes of runs and messages.

`Store` is the interface; `Store(engine)` and `Store.open(url)` return its implementation for the
database (`SqliteStore` or `PostgresStore`).
"""

from orchestrator.store.claims import Claim
from orchestrator.store.store import Store, forget_stores

__all__ = ["Claim", "Store", "forget_stores"]
