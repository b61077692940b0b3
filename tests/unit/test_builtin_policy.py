"""Behaviour of the built-in admission policy (CONTRACT.md §7.4, §9).

Fake secrets are assembled at runtime so that this file holds no secret-shaped literal.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from engram_memory.engine.context import HostFactDigests, Scope
from engram_memory.engine.ports import AdmissionRequest, PolicyDecision
from engram_memory.policy.builtin import (
    BuiltinAdmissionPolicy,
    DenyPattern,
    MaxTextBytes,
    RequireCitationScheme,
    parse_host_rules,
)
from engram_memory.policy.secrets import SecretScanner

from engram_testing import golden_payload

HEX64 = "0123456789abcdef" * 4
AKIA = "AKIA" + "Z" * 16
DB_CREDENTIAL = "Sup3r" + "Secr3t" + "Value"
PG_URL = f"postgres://app:{DB_CREDENTIAL}@db.internal:5432/app"


def _jwt() -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'ES256'})}.{part({'sub': 'agent-7'})}.{'s1gnature' * 5}"


JWT = _jwt()


def record(text: str = "Applied the documented correction.") -> dict[str, Any]:
    """A full record shaped like the golden payload plus the engine's derived fields."""
    payload = golden_payload()
    payload["components"][0]["text"] = text
    payload["citations"][0]["content_digest"] = "sha256:" + HEX64
    return {
        **payload,
        "scope_ref": "scope:" + HEX64[:32],
        "payload_digest": "sha256:" + HEX64,
        "recorded_at": "2026-08-16T12:34:57.000Z",
        "recorded_cursor": "12",
        "authorization_receipt_digest": "sha256:" + HEX64,
        "trust": {
            "class": "asserted",
            "evidence_digest": "sha256:" + HEX64,
            "verifier_id": "engram-host-default",
            "verifier_version": "1",
            "issued_at": "2026-08-16T12:34:57.000Z",
            "revocation_epoch": 0,
            "receipt_digest": "sha256:" + HEX64,
        },
        "record_digest": "sha256:" + HEX64,
        "record_id": "mem_" + "a" * 52,
    }


def evidence(**extra: str) -> dict[str, Any]:
    return {
        "evidence_ref": "evidence:chat-log",
        "evidence_digest": "sha256:" + HEX64,
        "citation_ids": ["citation:source"],
        **extra,
    }


def request(
    rec: dict[str, Any] | None = None,
    ev: dict[str, Any] | None = None,
    *,
    tenant: str = "tenant-7f3a9c2e",
    workspace: str = "default",
    host_facts: tuple[str, ...] = (),
) -> AdmissionRequest:
    return AdmissionRequest(
        scope=Scope(tenant, workspace),
        principal="user:ana",
        candidate_id="candidate_" + HEX64,
        record=rec if rec is not None else record(),
        evidence=ev if ev is not None else evidence(),
        host_facts=host_facts,
    )


@pytest.fixture(scope="module")
def scanner() -> SecretScanner:
    return SecretScanner()


@pytest.fixture(scope="module")
def policy(scanner: SecretScanner) -> BuiltinAdmissionPolicy:
    return BuiltinAdmissionPolicy(scanner=scanner)


def _set(path: str, value: str) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    """A mutation placing ``value`` at ``path`` (``record.x.0.y`` or ``evidence.x``)."""

    def apply(rec: dict[str, Any], ev: dict[str, Any]) -> None:
        root, *keys = path.split(".")
        target: Any = rec if root == "record" else ev
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value

    return apply


# --------------------------------------------------------------------------------------------
# Defaults and secrets
# --------------------------------------------------------------------------------------------


def test_a_clean_record_is_accepted(policy: BuiltinAdmissionPolicy) -> None:
    assert policy.decide(request()) == PolicyDecision("accept", "accept")
    assert policy.policy_id == "engram-builtin"


@pytest.mark.parametrize(
    ("path", "secret", "kind"),
    [
        ("record.components.0.text", f"my key is {AKIA}", "AWS Access Key"),
        ("record.citations.0.locator.value", PG_URL, "Basic Auth Credentials"),
        ("record.citations.0.locator.scheme", JWT, "JSON Web Token"),
        ("record.citations.0.source_ref", f"source:{AKIA}", "AWS Access Key"),
        ("record.citations.0.citation_id", f"citation:{AKIA}", "AWS Access Key"),
        ("record.components.0.component_id", f"component:{AKIA}", "AWS Access Key"),
        ("record.primary_event.type_ref", f"event:{AKIA}", "AWS Access Key"),
        ("record.purpose_ref", f"purpose:{AKIA}", "AWS Access Key"),
        ("evidence.evidence_ref", f"evidence:{JWT}", "JSON Web Token"),
        ("evidence.attestation", f"signed by {JWT}", "JSON Web Token"),
    ],
)
def test_a_secret_in_any_text_or_ref_field_is_rejected_without_echoing_it(
    policy: BuiltinAdmissionPolicy, path: str, secret: str, kind: str
) -> None:
    rec, ev = record(), evidence()
    _set(path, secret)(rec, ev)
    decision = policy.decide(request(rec, ev))
    assert decision == PolicyDecision("reject", f"secret:{kind}")
    for shown in (repr(decision), str(decision), decision.rule):
        assert all(value not in shown for value in (AKIA, JWT, DB_CREDENTIAL))


def test_a_multi_line_private_key_inside_a_component_text_is_rejected(
    policy: BuiltinAdmissionPolicy,
) -> None:
    dashes, label = "-" * 5, "RSA PRIVATE" + " KEY"
    body = "\n".join(["MIIEow" + "Ab9" * 19] * 4)
    pem = f"{dashes}BEGIN {label}{dashes}\n{body}\n{dashes}END {label}{dashes}"
    decision = policy.decide(request(record(f"The deploy key:\n{pem}\nKeep it safe.")))
    assert decision == PolicyDecision("reject", "secret:Private Key")


def test_digest_fields_are_not_scanned_even_when_they_look_like_secrets(
    policy: BuiltinAdmissionPolicy,
) -> None:
    rec = record()
    rec["citations"][0]["content_digest"] = "sha256:" + "f" * 64
    rec["payload_digest"] = AKIA  # not a digest, but a digest field is never treated as text
    rec["record_digest"] = JWT
    ev = evidence(evidence_digest="sha256:" + HEX64.upper())
    assert policy.decide(request(rec, ev)).decision == "accept"


def test_fields_the_engine_derives_are_not_examined(policy: BuiltinAdmissionPolicy) -> None:
    rec = record()
    rec["trust"]["verifier_id"] = "tenant-7f3a9c2e"
    rec["scope_ref"] = "scope:tenant-7f3a9c2e"
    assert policy.decide(request(rec, tenant="tenant-7f3a9c2e")).decision == "accept"


def test_ordinary_conversation_is_accepted(policy: BuiltinAdmissionPolicy) -> None:
    text = (
        "D1:3 Caroline: I went to the park with my kids on Sunday and we talked about my "
        "password manager. The secret: practice every day. See https://example.com/a?b=1 "
        "and request 550e8400-e29b-41d4-a716-446655440000 from 2026-08-16."
    )
    assert policy.decide(request(record(text))).decision == "accept"


def test_malformed_shapes_do_not_raise(policy: BuiltinAdmissionPolicy) -> None:
    rec: dict[str, Any] = {"components": "not a list", "citations": [{"locator": 3}, 7]}
    # No component text at all: nothing to remember, so low information.
    assert policy.decide(request(rec, {"evidence_ref": ["nested", {"deep": "ok"}]})) == (
        PolicyDecision("reject", "low-information")
    )


# --------------------------------------------------------------------------------------------
# Host binding facts
# --------------------------------------------------------------------------------------------


def test_a_distinctive_tenant_id_in_the_text_is_rejected(policy: BuiltinAdmissionPolicy) -> None:
    rec = record("Our tenant is TENANT-7F3A9C2E, remember it.")
    decision = policy.decide(request(rec, tenant="tenant-7f3a9c2e"))
    assert decision == PolicyDecision("reject", "host-fact")
    assert "7f3a9c2e" not in repr(decision).lower()


def test_a_distinctive_workspace_id_in_a_locator_is_rejected(
    policy: BuiltinAdmissionPolicy,
) -> None:
    rec = record()
    rec["citations"][0]["locator"]["value"] = "ws_01HZX3KQ/notes"
    assert policy.decide(request(rec, workspace="ws_01HZX3KQ")).rule == "host-fact"


@pytest.mark.parametrize("workspace", ["default", "production", "Marketing"])
def test_a_plain_word_scope_id_does_not_reject_text_using_that_word(
    policy: BuiltinAdmissionPolicy, workspace: str
) -> None:
    rec = record(f"By default we ship to production; marketing agreed. ({workspace})")
    assert policy.decide(request(rec, workspace=workspace)).decision == "accept"


def test_a_short_scope_id_does_not_count(policy: BuiltinAdmissionPolicy) -> None:
    rec = record("Item t-1 is done.")
    assert policy.decide(request(rec, tenant="t-1")).decision == "accept"


def test_a_host_fact_token_in_the_text_is_rejected(policy: BuiltinAdmissionPolicy) -> None:
    token = "opaque-" + "-".join(["a1b2"] * 6)
    rec = record(f"the call came with {token} attached")
    decision = policy.decide(request(rec, host_facts=(token,)))
    assert decision == PolicyDecision("reject", "host-fact")
    assert token not in repr(decision)


@pytest.mark.parametrize(
    "template",
    ["the call came with {} attached", "it ended with {}.", "token={}", "{}", "UPPER: {upper}"],
)
def test_a_host_fact_known_only_by_its_keyed_digest_is_rejected(
    policy: BuiltinAdmissionPolicy, template: str
) -> None:
    token = "opaque." + ".".join(["c3d4"] * 6)
    text = template.format(token, upper=token.upper())
    digests = HostFactDigests.of([token])
    decision = policy.decide(dataclasses.replace(request(record(text)), host_fact_digests=digests))
    assert decision == PolicyDecision("reject", "host-fact")


def test_a_text_without_the_digested_fact_is_accepted(policy: BuiltinAdmissionPolicy) -> None:
    digests = HostFactDigests.of(["opaque." + ".".join(["c3d4"] * 6)])
    rec = record("opaque.c3d4.c3d4 is only the start of some other token")
    decision = policy.decide(dataclasses.replace(request(rec), host_fact_digests=digests))
    assert decision.decision == "accept"


def test_a_host_fact_in_the_attestation_is_rejected(policy: BuiltinAdmissionPolicy) -> None:
    token = "session-" + "1a2b3c4d" * 3
    ev = evidence(attestation=f"attested within {token}")
    assert policy.decide(request(ev=ev, host_facts=(token,))).rule == "host-fact"


def test_host_facts_shorter_than_eight_characters_are_ignored(
    policy: BuiltinAdmissionPolicy,
) -> None:
    rec = record("the word case appears here")
    assert policy.decide(request(rec, host_facts=("case", "  ", ""))).decision == "accept"


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"engram_tools": ["search", "get"]}),
        '{"engram_confirm": ["capture"]}',
        "engram_retention: {allow_retain: true, max_expires_in_s: 60}",
        "ENGRAM_TOOLS=search,get",
        "'engram_reconcile': true",
    ],
)
def test_a_grant_claim_with_a_value_is_rejected(policy: BuiltinAdmissionPolicy, text: str) -> None:
    assert policy.decide(request(record(text))) == PolicyDecision("reject", "host-fact")


def test_naming_a_grant_claim_in_prose_is_accepted(policy: BuiltinAdmissionPolicy) -> None:
    rec = record("The engram_tools claim lists the granted tools; engram_confirm is optional.")
    assert policy.decide(request(rec)).decision == "accept"


def test_a_secret_wins_over_a_host_fact(policy: BuiltinAdmissionPolicy) -> None:
    rec = record(f"tenant-7f3a9c2e uses {AKIA}")
    assert policy.decide(request(rec)).rule == "secret:AWS Access Key"


# --------------------------------------------------------------------------------------------
# Host rules
# --------------------------------------------------------------------------------------------


def test_a_deny_pattern_rejects_any_matching_text(scanner: SecretScanner) -> None:
    rule = DenyPattern(name="no-ssn", pattern=re.compile(r"\b\d{3}-\d{2}-\d{4}\b"))
    policy = BuiltinAdmissionPolicy(host_rules=[rule], scanner=scanner, min_text_chars=0)
    rec = record()
    rec["citations"][0]["locator"]["value"] = "ssn 123-45-6789"
    assert policy.decide(request(rec)) == PolicyDecision("reject", "host:no-ssn")
    assert policy.decide(request()).decision == "accept"


def test_max_text_bytes_counts_utf8_bytes_of_component_texts(scanner: SecretScanner) -> None:
    (rule,) = parse_host_rules([{"kind": "max_text_bytes", "name": "short", "limit": 8}])
    policy = BuiltinAdmissionPolicy(host_rules=[rule], scanner=scanner, min_text_chars=0)
    assert policy.decide(request(record("é" * 4))).decision == "accept"  # 8 bytes
    assert policy.decide(request(record("é" * 5))) == PolicyDecision("reject", "host:short")
    ev = evidence(attestation="a long attestation is not a component text")
    assert policy.decide(request(record("short"), ev)).decision == "accept"


def test_require_citation_scheme_rejects_schemes_outside_the_list(
    scanner: SecretScanner,
) -> None:
    rule = RequireCitationScheme(name="docs-only", schemes=("document", "url"))
    policy = BuiltinAdmissionPolicy(host_rules=[rule], scanner=scanner, min_text_chars=0)
    assert policy.decide(request()).decision == "accept"
    rec = record()
    rec["citations"][0]["locator"]["scheme"] = "chat"
    assert policy.decide(request(rec)) == PolicyDecision("reject", "host:docs-only")
    del rec["citations"][0]["locator"]["scheme"]
    assert policy.decide(request(rec)).rule == "host:docs-only"


def test_host_rules_apply_in_order_after_the_never_store_checks(scanner: SecretScanner) -> None:
    rules = parse_host_rules(
        [
            {"kind": "deny_pattern", "name": "first", "pattern": "(?i)correction"},
            {"kind": "max_text_bytes", "name": "second", "limit": 1},
        ]
    )
    policy = BuiltinAdmissionPolicy(host_rules=rules, scanner=scanner)
    assert policy.decide(request()).rule == "host:first"
    assert policy.decide(request(record(f"correction {AKIA}"))).rule == "secret:AWS Access Key"


def test_parse_host_rules_reads_each_kind_from_config_data() -> None:
    rules = parse_host_rules(
        [
            {"kind": "deny_pattern", "name": "no-internal", "pattern": "(?i)internal only"},
            {"kind": "max_text_bytes", "name": "size", "limit": 4096},
            {"kind": "require_citation_scheme", "name": "schemes", "schemes": ["document"]},
        ]
    )
    assert [type(rule).__name__ for rule in rules] == [
        "DenyPattern",
        "MaxTextBytes",
        "RequireCitationScheme",
    ]
    assert isinstance(rules[0], DenyPattern)
    assert rules[0].pattern.search("INTERNAL ONLY")
    assert rules[2].model_dump(mode="json") == {
        "name": "schemes",
        "kind": "require_citation_scheme",
        "schemes": ["document"],
    }


@pytest.mark.parametrize(
    "data",
    [
        [{"kind": "allow_everything", "name": "x"}],
        [{"kind": "deny_pattern", "name": "x", "pattern": "("}],
        [{"kind": "deny_pattern", "name": "x", "pattern": "a", "extra": 1}],
        [{"kind": "deny_pattern", "name": "has space", "pattern": "a"}],
        [{"kind": "deny_pattern", "name": "x:y", "pattern": "a"}],
        [{"kind": "max_text_bytes", "name": "x", "limit": 0}],
        [{"kind": "max_text_bytes", "name": "x", "limit": "10"}],
        [{"kind": "require_citation_scheme", "name": "x", "schemes": []}],
        [{"kind": "deny_pattern", "pattern": "a"}],
        [
            {"kind": "deny_pattern", "name": "same", "pattern": "a"},
            {"kind": "max_text_bytes", "name": "same", "limit": 3},
        ],
    ],
)
def test_invalid_host_rule_config_is_refused(data: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - pydantic's ValidationError is a ValueError
        parse_host_rules(data)


def test_a_deny_pattern_compiled_with_out_of_line_flags_is_refused() -> None:
    with pytest.raises(ValueError, match="inline"):
        DenyPattern(name="x", pattern=re.compile("secret", re.IGNORECASE))
    assert DenyPattern(name="x", pattern=re.compile("(?i)secret")).pattern.search("SECRET")


def test_the_policy_refuses_an_unknown_mode_or_raw_dict_rules() -> None:
    with pytest.raises(ValueError, match="mode"):
        BuiltinAdmissionPolicy(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        BuiltinAdmissionPolicy(host_rules=[{"kind": "max_text_bytes"}])  # type: ignore[list-item]


# --------------------------------------------------------------------------------------------
# Manual mode and versions
# --------------------------------------------------------------------------------------------


def test_manual_mode_asks_for_adjudication_but_still_rejects_secrets(
    scanner: SecretScanner,
) -> None:
    policy = BuiltinAdmissionPolicy(mode="manual", scanner=scanner)
    assert policy.decide(request()) == PolicyDecision("adjudication_required", "manual")
    rec = record(f"deploy with {AKIA}")
    assert policy.decide(request(rec)) == PolicyDecision("reject", "secret:AWS Access Key")
    assert policy.decide(request(record('{"engram_tools": []}'))).rule == "host-fact"


def test_the_version_is_stable_for_one_configuration_and_changes_with_it(
    scanner: SecretScanner,
) -> None:
    rules = parse_host_rules([{"kind": "max_text_bytes", "name": "size", "limit": 100}])
    base = BuiltinAdmissionPolicy(host_rules=rules, scanner=scanner)
    assert re.fullmatch(r"builtin-1:[0-9a-f]{16}", base.version())
    assert base.version() == base.version()
    assert BuiltinAdmissionPolicy(host_rules=rules).version() == base.version()
    same = [MaxTextBytes(name="size", limit=100)]
    assert BuiltinAdmissionPolicy(host_rules=same, scanner=scanner).version() == base.version()

    variants = [
        BuiltinAdmissionPolicy(scanner=scanner),
        BuiltinAdmissionPolicy(mode="manual", host_rules=rules, scanner=scanner),
        BuiltinAdmissionPolicy(host_rules=[MaxTextBytes(name="size", limit=101)], scanner=scanner),
        BuiltinAdmissionPolicy(host_rules=[MaxTextBytes(name="cap", limit=100)], scanner=scanner),
        BuiltinAdmissionPolicy(
            host_rules=[*rules, DenyPattern(name="x", pattern=re.compile("x"))], scanner=scanner
        ),
    ]
    versions = {base.version(), *(variant.version() for variant in variants)}
    assert len(versions) == len(variants) + 1


def test_deciding_does_not_mutate_the_request(policy: BuiltinAdmissionPolicy) -> None:
    rec, ev = record(f"key {AKIA}"), evidence(attestation="ok")
    before = copy.deepcopy((rec, ev))
    policy.decide(request(rec, ev))
    assert (rec, ev) == before
