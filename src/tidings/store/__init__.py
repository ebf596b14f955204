"""The store: one engine over SQLite or PostgreSQL, migrations, and one module per table family."""

from .engine import Store, Tx, is_transient

__all__ = ["Store", "Tx", "is_transient"]
