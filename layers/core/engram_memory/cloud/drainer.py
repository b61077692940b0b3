"""The outbox drainer function of the cloud stack (``functions/outbox_drainer/app.py``).

Two kinds of event:

- **The schedule** (an EventBridge rule every minute; any event without ``operation``): run the
  outbox of every scope — projection upserts the commit path could not finish, projection drops,
  key destructions — page after page until a page makes no progress or the Lambda's time is
  nearly up; then finish shredded S3 bodies whose deletion failed, and emit
  ``OutboxOldestAgeSeconds``, ``OutboxPending`` and ``OutboxDrained`` (``observability``). The
  age is that of the oldest item among the first page still pending (the outbox queue is ordered
  by item id, not age: with more than a page stuck, a lower bound).
- **An operator's reindex**: ``{"operation": "reindex", "workspace_id": "<w>"}`` (tenant: the
  stack's own ``ENGRAM_TENANT_ID``), e.g. with ``aws lambda invoke``: rebuild that workspace's
  OpenSearch documents from the canonical store (``operator_plane.repair.reindex``) and answer the
  report (counts only).

The function runs with the workflow function's role (DynamoDB, S3 bodies, data-key
destruction, OpenSearch writes): exactly what draining needs, and nothing an agent can reach.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from engram_memory.cloud.observability import get_logger, record_outbox_state
from engram_memory.cloud.settings import LAMBDA_DEADLINE_MARGIN_MS, DrainerSettings
from engram_memory.cloud.tool_handler import EngineHandler
from engram_memory.engine.context import Scope
from engram_memory.engine.service import Engine
from engram_memory.operator_plane.repair import reindex

DRAIN_PAGE: Final = 100
# Without a Lambda context (tests, a local call), one run drains for at most this long.
DEFAULT_RUN_MS: Final = 60_000


class ReindexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    operation: Literal["reindex"]
    workspace_id: StrictStr = Field(min_length=1, max_length=256)


class DrainerHandler(EngineHandler):
    """The cold-start singletons (``settings``, ``engine``, ``binding``) and the two operations."""

    settings_model = DrainerSettings

    def _handle(self, event: Any, context: Any) -> dict[str, Any]:
        engine, binding = self._ready()
        if isinstance(event, Mapping) and "operation" in event:
            request = ReindexRequest.model_validate(event)
            scope = Scope(binding.tenant_id, request.workspace_id)
            report = reindex(engine, scope)
            get_logger().info("reindexed", extra={"workspace_id": scope.workspace_id})
            return {"operation": "reindex", **report.as_dict()}
        return self.drain(engine, context)

    @staticmethod
    def drain(engine: Engine, context: Any) -> dict[str, Any]:
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        budget_ms = DEFAULT_RUN_MS if remaining is None else int(remaining())
        ends = time.monotonic() + max(0, budget_ms - LAMBDA_DEADLINE_MARGIN_MS) / 1000
        drained = 0
        while time.monotonic() < ends:
            completed = engine.drain_outbox(DRAIN_PAGE)
            drained += completed
            if completed == 0:
                break
        collect = getattr(engine.store, "collect_shredded_blobs", None)
        if callable(collect):
            collect()
        pending = engine.store.outbox_pending(DRAIN_PAGE)
        now_ms = engine.clock.now_ms()
        ages = [now_ms - item.enqueued_at_ms for item in pending if item.enqueued_at_ms > 0]
        oldest_age_s = max(ages, default=0) / 1000
        record_outbox_state(oldest_age_s=oldest_age_s, pending=len(pending), drained=drained)
        return {"drained": drained, "pending": len(pending), "oldest_age_s": oldest_age_s}


def drainer_handler() -> DrainerHandler:
    """The Lambda handler of the drainer function: ``handler = drainer_handler()``."""
    return DrainerHandler()
