"""Adapters: concrete implementations of the engine ports (embedded ``local`` and cloud)."""
