"""How the benchmark reaches the tools: ``Engine.handle`` in process, or the MCP HTTP endpoint.

One engine per profile over the same data directory: ``lexical`` has no embedder (the
``offline_lexical_v1`` profile); ``semantic`` and ``hybrid`` share one local embedder and differ
in the engine's ``semantic_mode`` (``semantic_only`` / ``hybrid``, both ``semantic_v1``, told
apart by the rank receipt's ``profile_config_digest``). ``lexical-notime`` and ``hybrid-notime``
are the same without time-aware ranking (``search.time_aware`` false: profile versions 2.0.0 and
1.0.0), so one run shows the ranking before and after it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.in_process import envelope
from engram_memory.binding.host_config import HostConfig
from engram_memory.embedded.composition import open_embedded
from engram_memory.engine.context import TrustedContext
from engram_memory.engine.service import Engine, new_audit_id

from .calls import PRINCIPAL, PURPOSE, TENANT

SEMANTIC_MODES = {
    "semantic": "semantic_only",
    "hybrid": "hybrid",
    "hybrid-notime": "hybrid",
}
# The profiles without time-aware ranking (engine/temporal.py): the ranking before it, beside it.
UNTIMED = ("lexical-notime", "hybrid-notime")


class EngineClient:
    """Calls ``Engine.handle`` with the trusted context the host would bind for the workspace."""

    def __init__(self, engine: Engine, tenant: str = TENANT) -> None:
        self.engine = engine
        self.tenant = tenant

    def call(self, workspace: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        ctx = TrustedContext(
            tenant_id=self.tenant,
            workspace_id=workspace,
            principal=PRINCIPAL,
            purpose_ref=PURPOSE,
            audit_id=new_audit_id(),
        )
        return envelope(self.engine.handle(tool, arguments, ctx))


def engine_options(profiles: Sequence[str], fusion: str) -> dict[str, dict[str, Any]]:
    """``open_embedded`` options per profile; one local embedder shared by the semantic ones."""
    configs = {
        time_aware: HostConfig.model_validate(
            {
                "search": {"fusion": fusion, "time_aware": time_aware},
                # Every turn is stored: the retrieval figures assume it (short and repeated
                # turns included); bench.governance.admission measures the gate.
                "admission": {"near_duplicates": "off", "min_text_chars": 0},
            }
        )
        for time_aware in (True, False)
    }
    embedder = None
    if any(p in SEMANTIC_MODES for p in profiles):
        from engram_memory.adapters.embedder import load_local_embedder

        embedder = load_local_embedder()
    return {
        profile: {"config": configs[profile not in UNTIMED]}
        | (
            {"embedder": embedder, "semantic_mode": SEMANTIC_MODES[profile]}
            if profile in SEMANTIC_MODES
            else {}
        )
        for profile in profiles
    }


@contextmanager
def open_clients(
    data_dir: Path, profiles: Sequence[str], via_mcp: bool, fusion: str = "minmax"
) -> Iterator[dict[str, Any]]:
    options = engine_options(profiles, fusion)
    if via_mcp:
        from .mcp_client import open_mcp_clients

        with open_mcp_clients(data_dir, options) as mcp_clients:
            yield dict(mcp_clients)
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        clients: dict[str, Any] = {}
        for profile in profiles:
            host = open_embedded(data_dir, **options[profile])
            stack.callback(host.close)
            clients[profile] = EngineClient(host.engine)
        yield clients
