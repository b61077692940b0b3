"""A stateful model of the lifecycle and the idempotency ledger, checked against the real engine.

Hypothesis drives random sequences of the four mutations (with reused keys, foreign principals
and replays) and after every step the engine must agree with a tiny reference model: which
candidates are pending, which records are searchable, what a replay returns, and a journal whose
cursors are dense and whose hash chain is unbroken.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engram_memory.engine.journal import verify_journal

from engram_testing import capture_args, context, embedded_harness

TEXTS = ["alpha harbour notes", "beta harbour notes", "gamma orchard plan", "delta orchard plan"]
KEYS = [f"model-key-{i:08d}" for i in range(6)]
PRINCIPALS = ["agent-alice", "agent-bob"]


class LifecycleModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="engram-model-"))
        self.h = embedded_harness(self.dir)
        # The model samples a few texts again and again: lifecycle, not admission quality.
        self.h.without_quality_gate()
        # (principal, key) -> (tool, intent marker, first output)
        self.ledger: dict[tuple[str, str], tuple[str, Any, dict[str, Any]]] = {}
        self.candidates: dict[
            str, dict[str, Any]
        ] = {}  # candidate_id -> {principal, state, text, record_id}
        self.records: dict[str, str] = {}  # record_id -> state
        self.events = 0

    def teardown(self) -> None:
        self.h.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _remember_key(
        self, principal: str, key: str, tool: str, intent: Any, envelope: dict[str, Any]
    ) -> str | None:
        """Apply the ledger rules: None for a key not used yet, else "REPLAY", or "DIGEST_CONFLICT"
        (checked here) for a key used for another call."""
        entry = self.ledger.get((principal, key))
        if entry is None:
            return None
        if entry[0] != tool or entry[1] != intent:
            assert envelope["error"]["code"] == "DIGEST_CONFLICT"
            return "DIGEST_CONFLICT"
        return "REPLAY"

    def _used_key(
        self, principal: str, key: str, tool: str, target: str, envelope: dict[str, Any]
    ) -> bool:
        """For a forget or a withdraw: whether the key was used before (its answer checked)."""
        expected = self._remember_key(principal, key, tool, target, envelope)
        if expected == "REPLAY":
            assert envelope["output"]["value"]["replayed"] is True
        return expected is not None

    @rule(
        text=st.sampled_from(TEXTS),
        key=st.sampled_from(KEYS),
        principal=st.sampled_from(PRINCIPALS),
    )
    def capture(self, text: str, key: str, principal: str) -> None:
        envelope = self.h.call("capture", capture_args(text, key=key), context(principal=principal))
        expected = self._remember_key(principal, key, "capture", text, envelope)
        if expected == "DIGEST_CONFLICT":
            return
        value = envelope["output"]["value"]
        if expected == "REPLAY":
            first = self.ledger[(principal, key)][2]
            assert value == {**first, "status": "duplicate_exact"}
            return
        assert value["status"] == "committed_pending"
        self.events += 1
        assert value["cursor"] == str(self.events)
        self.ledger[(principal, key)] = ("capture", text, value)
        self.candidates[value["candidate_id"]] = {
            "principal": principal,
            "state": "pending",
            "text": text,
        }

    @precondition(lambda self: bool(self.candidates))
    @rule(data=st.data(), key=st.sampled_from(KEYS), principal=st.sampled_from(PRINCIPALS))
    def admit(self, data: st.DataObject, key: str, principal: str) -> None:
        candidate_id = data.draw(st.sampled_from(sorted(self.candidates)))
        envelope = self.h.call(
            "request_admission",
            {"candidate_id": candidate_id, "idempotency_key": key},
            context(principal=principal),
        )
        expected = self._remember_key(principal, key, "request_admission", candidate_id, envelope)
        if expected == "DIGEST_CONFLICT":
            return
        if expected == "REPLAY":
            assert envelope["output"]["value"]["replayed"] is True
            assert (
                envelope["output"]["value"]["outcome"]
                == self.ledger[(principal, key)][2]["outcome"]
            )
            return
        candidate = self.candidates[candidate_id]
        if candidate["principal"] != principal or candidate["state"] != "pending":
            assert envelope["error"]["code"] == "NOT_FOUND"
            return
        outcome = envelope["output"]["value"]["outcome"]
        if candidate.get("held") or any(
            c["text"] == candidate["text"]
            and c.get("record_id")
            and self.records[c["record_id"]] == "tombstoned"
            for c in self.candidates.values()
        ):
            # the tombstone guard held it (now or before, under another key): the hold is kept
            # with the key and on the candidate, no event is written
            assert outcome["status"] == "pending_adjudication"
            candidate["held"] = True
            self.ledger[(principal, key)] = (
                "request_admission",
                candidate_id,
                envelope["output"]["value"],
            )
            return
        assert outcome["status"] == "accepted"
        self.events += 1
        candidate["state"] = "admitted"
        candidate["record_id"] = outcome["record_id"]
        self.records[outcome["record_id"]] = "accepted_current"
        self.ledger[(principal, key)] = (
            "request_admission",
            candidate_id,
            envelope["output"]["value"],
        )

    @precondition(lambda self: bool(self.candidates))
    @rule(data=st.data(), key=st.sampled_from(KEYS), principal=st.sampled_from(PRINCIPALS))
    def withdraw(self, data: st.DataObject, key: str, principal: str) -> None:
        candidate_id = data.draw(st.sampled_from(sorted(self.candidates)))
        envelope = self.h.withdraw(candidate_id, key=key, ctx=context(principal=principal))
        if self._used_key(principal, key, "withdraw", candidate_id, envelope):
            return
        candidate = self.candidates[candidate_id]
        expected_code = (
            "NOT_FOUND"
            if candidate["principal"] != principal
            else {
                "pending": None,
                "withdrawn": "ALREADY_TERMINAL",
                "admitted": "ILLEGAL_TRANSITION",
            }[candidate["state"]]
        )
        if expected_code:
            assert envelope["error"]["code"] == expected_code
            return
        assert envelope["output"]["value"]["key_destruction"] == "complete"
        self.events += 1
        candidate["state"] = "withdrawn"
        self.ledger[(principal, key)] = ("withdraw", candidate_id, envelope["output"]["value"])

    @precondition(lambda self: bool(self.records))
    @rule(data=st.data(), key=st.sampled_from(KEYS), principal=st.sampled_from(PRINCIPALS))
    def forget(self, data: st.DataObject, key: str, principal: str) -> None:
        record_id = data.draw(st.sampled_from(sorted(self.records)))
        envelope = self.h.forget(record_id, key=key, ctx=context(principal=principal))
        if self._used_key(principal, key, "forget", record_id, envelope):
            return
        if self.records[record_id] == "tombstoned":
            assert envelope["error"]["code"] == "ALREADY_TERMINAL"
            return
        assert envelope["output"]["value"]["receipt"]["to_state"] == "tombstoned"
        self.events += 1
        self.records[record_id] = "tombstoned"
        self.ledger[(principal, key)] = ("forget", record_id, envelope["output"]["value"])

    @invariant()
    def search_shows_exactly_the_current_records(self) -> None:
        found = {
            p["record"]["record_id"]
            for p in self.h.search("harbour orchard notes plan alpha beta gamma delta", limit=50)[
                "records"
            ]
        }
        assert found == {r for r, state in self.records.items() if state == "accepted_current"}

    @invariant()
    def the_journal_is_dense_and_chained(self) -> None:
        assert verify_journal(self.h.store, context().scope).cursor == self.events


TestLifecycleModel = LifecycleModel.TestCase
TestLifecycleModel.settings = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
