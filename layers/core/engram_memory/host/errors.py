"""The host's configuration errors, importable without pydantic (the command line's fast path)."""

from __future__ import annotations

__all__ = ["HostConfigError"]


class HostConfigError(ValueError):
    """``host.json`` cannot be read or does not hold a valid host configuration.

    The message is meant for a person: it names the file and what is wrong with it.
    """
