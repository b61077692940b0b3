"""Isolation benchmark: can another tenant, workspace or principal reach a scope's canaries?

One embedded MCP server; every caller is the official client with a real bearer token the data
directory's issuer mints (``served``), and a person behind each client who approves whatever
it is asked (the worst case: a probe that got as far as a confirmation would be carried out).
The owner (``alice``, workspace ``ws-alpha``) remembers half of N canaries and leaves the other
half pending. Then three callers probe them:

- ``cross_tenant``: a token of another tenant (same issuer, same workspace name);
- ``cross_workspace``: a principal of another workspace of the same tenant;
- ``cross_principal``: another principal of the same workspace. Records are shared within a
  workspace by design, so this caller probes only the pending candidates, which are private
  to the principal that captured them.

Probes: search for every canary's words; get, forget each record id; withdraw, request
admission of each candidate id; replay the owner's capture idempotency key with the same
arguments (a ledger not keyed by principal would answer the owner's candidate); get, forget,
withdraw ids guessed in the ids' own shapes (random, and a real id with one character
changed). Found = a probe that answered a canary's words, an id of the owner's, or succeeded
on the owner's memory; expected 0. Afterwards the owner's records must all still open.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.governance.canaries import Canary, canaries, found_in_text
from bench.governance.served import PURPOSE, Agent, Served, canary_capture, served

OWNER, HOME = "alice", "ws-alpha"
CALLERS = {
    "cross_tenant": ("eve", HOME, "another-tenant"),
    "cross_workspace": ("mallory", "ws-beta", None),
    "cross_principal": ("bob", HOME, None),
}
BASE32 = "abcdefghijklmnopqrstuvwxyz234567"


class Tally:
    """Probes run, found, and the error codes answered, for one caller."""

    def __init__(self) -> None:
        self.probes = 0
        self.found: list[str] = []
        self.codes: dict[str, int] = {}

    def probe(self, what: str, envelope: dict[str, Any], leaked: bool) -> None:
        self.probes += 1
        if leaked:
            self.found.append(what)
        code = "ok" if envelope["ok"] else envelope["error"]["code"]
        self.codes[code] = self.codes.get(code, 0) + 1

    def report(self, asked: int) -> dict[str, Any]:
        return {
            "probes": self.probes,
            "found": len(self.found),
            "found_what": self.found,
            "codes": dict(sorted(self.codes.items())),
            "approvals_asked": asked,
        }


def guessed(real: str) -> list[str]:
    """Ids in ``real``'s shape: a random one, and ``real`` with its last character changed."""
    prefix, _, body = real.partition("_")
    alphabet = "0123456789abcdef" if prefix == "candidate" else BASE32
    random_id = prefix + "_" + "".join(secrets.choice(alphabet) for _ in body)
    last = alphabet[(alphabet.index(body[-1]) + 1) % len(alphabet)]
    return [random_id, real[:-1] + last]


def _search_probes(agent: Agent, tally: Tally, every: Sequence[Canary], owned: set[str]) -> None:
    for canary in every:
        envelope = agent.call(
            "search", {"query": " ".join(canary.words), "purpose_ref": PURPOSE, "limit": 50}
        )
        answered = str(envelope.get("output", ""))
        leaked = bool(found_in_text(answered, [canary])) or any(i in answered for i in owned)
        tally.probe(f"search:{canary.key}", envelope, leaked)


def _record_probes(agent: Agent, tally: Tally, records: dict[str, str]) -> None:
    """Get and forget each record id, and ids guessed from it: any success is found."""
    for key, record_id in records.items():
        for target in (record_id, *guessed(record_id)):
            which = key if target == record_id else f"{key}-guess"
            got = agent.call("get", {"record_id": target, "purpose_ref": PURPOSE})
            tally.probe(f"get:{which}", got, got["ok"])
            forgot = agent.forget(target, f"probe-forget-{target[-16:]}")
            tally.probe(f"forget:{which}", forgot, forgot["ok"])


def _candidate_probes(agent: Agent, tally: Tally, pending: dict[str, str]) -> None:
    """Withdraw and ask admission of each candidate id, and withdraw ids guessed from it."""
    for key, candidate_id in pending.items():
        admit = {"candidate_id": candidate_id, "idempotency_key": f"probe-admit-{key}-x"}
        admitted = agent.call("request_admission", admit)
        tally.probe(f"admit:{key}", admitted, admitted["ok"])
        for target in (candidate_id, *guessed(candidate_id)):
            which = key if target == candidate_id else f"{key}-guess"
            withdrawn = agent.withdraw(target, f"probe-withdraw-{target[-16:]}")
            tally.probe(f"withdraw:{which}", withdrawn, withdrawn["ok"])


def _replay_probes(
    agent: Agent, tally: Tally, pending: dict[str, str], among: list[Canary]
) -> None:
    """The owner's capture keys and arguments again: a fresh candidate of the caller's own (or a
    refusal), never the owner's candidate."""
    for canary in among:
        envelope = agent.call("capture", canary_capture(canary))
        value = envelope.get("output", {}).get("value", {}) if envelope["ok"] else {}
        tally.probe(
            f"replay:{canary.key}", envelope, value.get("candidate_id") == pending[canary.key]
        )


def _probe(live: Served, name: str, owned: dict[str, Any]) -> dict[str, Any]:
    principal, workspace, tenant = CALLERS[name]
    agent = live.agent(principal, workspace, tenant)
    tally = Tally()
    records, pending = owned["records"], owned["pending"]
    if name == "cross_principal":  # the workspace's records are this caller's to read too
        _search_probes(agent, tally, owned["pending_canaries"], set(pending.values()))
    else:
        _search_probes(agent, tally, owned["canaries"], {*records.values(), *pending.values()})
        _record_probes(agent, tally, records)
    _candidate_probes(agent, tally, pending)
    _replay_probes(agent, tally, pending, owned["pending_canaries"])
    return tally.report(len(agent.human.asked))


def run(count: int, work: Path) -> dict[str, Any]:
    """The isolation run over ``count`` canaries of one owner in ``work`` (an empty folder)."""
    every = canaries(count, "isolate")
    kept, held = every[: count // 2], every[count // 2 :]
    with served(work / "engram") as live:
        owner = live.agent(OWNER, HOME)
        owned: dict[str, Any] = {
            "canaries": every,
            "records": {c.key: owner.remember(c) for c in kept},
            "pending": {c.key: owner.capture(c) for c in held},
            "pending_canaries": held,
        }
        callers = {name: _probe(live, name, owned) for name in CALLERS}
        intact = sum(
            owner.call("get", {"record_id": record_id, "purpose_ref": PURPOSE})["ok"]
            for record_id in owned["records"].values()
        )
    return {
        "canaries": count,
        "owner_records_intact": f"{intact}/{len(kept)}",
        "callers": callers,
        "probes": sum(c["probes"] for c in callers.values()),
        "found": sum(c["found"] for c in callers.values()),
    }
