"""The one network policy of every AWS client of the cloud stack (``client_config``).

Connect fast, read within the slowest call the stack makes (a KMS or DynamoDB round trip),
standard retries. The composition root (``cloud.settings``) builds every client with it, and an
adapter that must build a client itself (none was injected) uses the same; only the MCP
adapter's Lambda client differs, and only by its arguments (it waits as long as a tool function
may run and never retries a slow invocation). It lives here, beside the adapters, because an
adapter may not import the composition root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from botocore.config import Config

CONNECT_TIMEOUT_S: Final = 2
READ_TIMEOUT_S: Final = 5
MAX_ATTEMPTS: Final = 3  # botocore's standard mode: the first try and two retries


def client_config(*, read_timeout_s: float = READ_TIMEOUT_S, retries: bool = True) -> Config:
    """The botocore ``Config`` of every client the cloud functions and adapters build."""
    from botocore.config import Config

    return Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=read_timeout_s,
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS if retries else 1},
    )
