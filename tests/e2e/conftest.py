"""Fixtures of the end-to-end suite: defined (and type-checked) in ``e2e_support``."""

from e2e_support import anyio_backend, http_service, stdio_home

__all__ = ["anyio_backend", "http_service", "stdio_home"]
