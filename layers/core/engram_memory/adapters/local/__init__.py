"""Embedded adapters: SQLite store and index, local vault, in-process workflow."""
