"""The host's configuration errors, importable without pydantic (the command line's fast path)."""

from __future__ import annotations

__all__ = ["DataDirectoryRefused", "HostConfigError"]


class HostConfigError(ValueError):
    """``host.json`` cannot be read or does not hold a valid host configuration.

    The message is meant for a person: it names the file and what is wrong with it.
    """


class DataDirectoryRefused(HostConfigError):
    """The data directory cannot be used as it is: it holds memories but not the key store that
    belongs to them, or it is not an initialised data directory at all. Nothing was created.

    The message is one sentence for a person: what happened and what to do.
    """
