"""The run store: tables, migrations and the guarded reads and writes of runs and messages."""

from orchestrator.store.store import Claim, Store, forget_stores

__all__ = ["Claim", "Store", "forget_stores"]
