"""The built-in admission policy (CONTRACT.md §7.4, §9).

``BuiltinAdmissionPolicy.decide`` looks at the record a candidate would become and its evidence,
and answers in this order (the first rule that fires decides):

1. ``reject`` / ``secret:<kind>``: a secret is present (``SecretScanner``).
2. ``reject`` / ``host-fact``: a host binding fact is present: one of the request's
   ``host_facts`` (e.g. the bearer token), a distinctive tenant or workspace id, or a grant claim
   (``engram_tools``, ``engram_confirm``, ``engram_retention``, ``engram_reconcile``) with a value.
3. ``reject`` / ``host:<rule name>``: one of the host's configured ``HostRule`` objects fires.
4. ``reject`` / ``low-information``: the component texts are empty after normalization or hold
   fewer than ``min_text_chars`` letters and digits (``policy.quality``).
5. ``adjudication_required`` (``near_duplicates="pending_adjudication"``, the default) or
   ``reject`` (``"rejected"``) / ``near-duplicate``: the candidate's text is a near-duplicate of
   a current record of the same scope (``AdmissionRequest.neighbours``; shingled MinHash at
   ``near_duplicate_threshold``). ``PolicyDecision.resembles`` names the records, for operators:
   the agent's outcome carries only its status.
6. ``adjudication_required`` / ``manual`` in manual mode, else ``accept`` / ``accept``.

What is looked at ("the texts"): every string value of the record and of the evidence, at any
depth (component texts, ``purpose_ref``, ``primary_event.type_ref``, component and citation ids,
``source_ref``, locator scheme and value, ``evidence_ref``, ``attestation``...), except digest
fields (a key named ``digest`` or ending in ``_digest``: hex by construction) and the fields the
engine derives itself rather than takes from the agent (``scope_ref``, ``record_id``,
``recorded_at``, ``recorded_cursor``, ``trust``).

Decisions name rules by identifier only; neither they nor any exception raised here carries the
content that was examined.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    field_validator,
)

from engram_memory.engine.context import HostFactDigests
from engram_memory.engine.ports import AdmissionRequest, PolicyDecision
from engram_memory.policy.quality import (
    DEFAULT_MIN_TEXT_CHARS,
    DEFAULT_NEAR_DUPLICATE_THRESHOLD,
    NUM_PERM,
    SHINGLE,
    band_keys,
    low_information,
    memo_partition,
    resembled,
)
from engram_memory.policy.secrets import SecretScanner

if TYPE_CHECKING:
    from engram_memory.engine.ports import AdmissionPolicy

__all__ = [
    "POLICY_ID",
    "BuiltinAdmissionPolicy",
    "DenyPattern",
    "HostRule",
    "MaxTextBytes",
    "NearDuplicateAction",
    "RequireCitationScheme",
    "parse_host_rules",
]

POLICY_ID: Final = "engram-builtin"
NearDuplicateAction = Literal["pending_adjudication", "rejected", "off"]
_VERSION_PREFIX: Final = "builtin-1:"

# Record fields the engine derives (records.build_record / stored_payload), never agent content.
_DERIVED_RECORD_FIELDS: Final = frozenset(
    {"scope_ref", "record_id", "recorded_at", "recorded_cursor", "trust"}
)

# A scope id only counts as a host fact when it is distinctive: at least this long and not a
# plain word. Otherwise a workspace called "default" would reject every text using that word.
_MIN_DISTINCTIVE_ID: Final = 8
# Shorter host facts are ignored: they would match ordinary text by chance.
_MIN_HOST_FACT: Final = 8
# What a bearer token can be made of (RFC 6750 b64token; a JWT's three parts): the runs of a
# text a keyed host-fact digest is compared with.
_TOKEN_RUN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")

# A host grant claim name followed by an assignment and a value (`"engram_tools": [...]`,
# `engram_confirm=capture`). The bare name in prose ("the engram_tools claim") is fine.
_GRANT_CLAIM: Final = re.compile(
    r"(?<![\w-])[\"']?engram_(?:tools|confirm|retention|reconcile)[\"']?\s*[:=]\s*\S",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------------------------
# Host rules
# --------------------------------------------------------------------------------------------

RuleName = Annotated[
    StrictStr,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Identifier of the rule, reported as `host:<name>` when it rejects.",
    ),
]


class _HostRuleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: RuleName


class DenyPattern(_HostRuleBase):
    """Reject when any text (see the module docstring) matches ``pattern`` (Python ``re``)."""

    kind: Literal["deny_pattern"] = Field(default="deny_pattern", description="Rule kind.")
    pattern: re.Pattern[str] = Field(
        description="Python regular expression searched in every text; flags go inline, e.g. (?i)."
    )

    @field_validator("pattern")
    @classmethod
    def _flags_inline(cls, value: re.Pattern[str]) -> re.Pattern[str]:
        # The rule is stored (and hashed into the policy version) as its pattern text, so flags
        # passed to re.compile() instead of written inline would silently get lost.
        if re.compile(value.pattern).flags != value.flags:
            raise ValueError("write regular expression flags inline, e.g. (?i)")
        return value

    def violated_by(self, subject: _Subject) -> bool:
        """True when the rule rejects ``subject``."""
        return any(self.pattern.search(text) for text in subject.texts)


class MaxTextBytes(_HostRuleBase):
    """Reject when any component text is longer than ``limit`` UTF-8 bytes."""

    kind: Literal["max_text_bytes"] = Field(default="max_text_bytes", description="Rule kind.")
    limit: StrictInt = Field(ge=1, description="Largest allowed component text, in UTF-8 bytes.")

    def violated_by(self, subject: _Subject) -> bool:
        """True when the rule rejects ``subject``."""
        return any(len(text.encode("utf-8")) > self.limit for text in subject.component_texts)


class RequireCitationScheme(_HostRuleBase):
    """Reject when a citation's locator scheme is not one of ``schemes``."""

    kind: Literal["require_citation_scheme"] = Field(
        default="require_citation_scheme", description="Rule kind."
    )
    schemes: tuple[StrictStr, ...] = Field(
        min_length=1, description="The allowed `citations[].locator.scheme` values."
    )

    def violated_by(self, subject: _Subject) -> bool:
        """True when the rule rejects ``subject`` (a missing scheme is outside any list)."""
        return any(scheme not in self.schemes for scheme in subject.citation_schemes)


HostRule = Annotated[
    DenyPattern | MaxTextBytes | RequireCitationScheme, Field(discriminator="kind")
]
"""One host admission rule, as a host configuration file holds it (closed union on ``kind``)."""

_HOST_RULES: Final = TypeAdapter(list[HostRule])


def parse_host_rules(data: Sequence[Mapping[str, Any]]) -> tuple[HostRule, ...]:
    """Validate host rules from configuration data (e.g. a parsed JSON or YAML list).

    Raises ``ValueError`` (pydantic's ``ValidationError`` is one) for an unknown ``kind``, a
    missing or extra field, an invalid regular expression, or two rules with the same name.
    """
    rules = tuple(_HOST_RULES.validate_python(list(data)))
    _check_unique_names(rules)
    return rules


def _check_unique_names(rules: Sequence[HostRule]) -> None:
    names = [rule.name for rule in rules]
    if len(set(names)) != len(names):
        # Decisions identify a rule by name, so names must be unambiguous.
        raise ValueError("host rule names must be unique")


# --------------------------------------------------------------------------------------------
# What a decision looks at
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Subject:
    texts: tuple[str, ...]  # every examined string, record first, then evidence
    component_texts: tuple[str, ...]
    citation_schemes: tuple[str, ...]  # "" where a citation has no string scheme


def _is_digest_field(key: str) -> bool:
    return key == "digest" or key.endswith("_digest")


def _strings(value: Any, skip_top_level: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every string under ``value`` except digest fields, keys in sorted order.

    Sorting makes the order (and so the first finding, hence the rule) independent of how the
    mappings happen to be ordered. Iterative, so no input shape can exhaust the stack.
    """
    stack: list[Any] = [value]
    top = True
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            children = [
                child
                for key, child in sorted(item.items(), key=lambda pair: str(pair[0]))
                if not (isinstance(key, str) and _is_digest_field(key))
                and not (top and key in skip_top_level)
            ]
            stack.extend(reversed(children))
        elif isinstance(item, Sequence) and not isinstance(item, bytes | bytearray):
            stack.extend(reversed(item))
        top = False


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return [item for item in value if isinstance(item, Mapping)]
    return []


def _subject(request: AdmissionRequest) -> _Subject:
    record = request.record
    texts = (*_strings(record, _DERIVED_RECORD_FIELDS), *_strings(request.evidence))
    components = _mappings(record.get("components"))
    component_texts = tuple(c["text"] for c in components if isinstance(c.get("text"), str))
    schemes: list[str] = []
    for citation in _mappings(record.get("citations")):
        locator = citation.get("locator")
        scheme = locator.get("scheme") if isinstance(locator, Mapping) else None
        schemes.append(scheme if isinstance(scheme, str) else "")
    return _Subject(texts, component_texts, tuple(schemes))


def _is_distinctive_id(value: str) -> bool:
    # A plain word ("default", "production") appears in ordinary text; an id with digits or
    # punctuation ("acme-prod-7", "ws_01HZX3") does not, unless the id itself is being stored.
    return len(value) >= _MIN_DISTINCTIVE_ID and not value.replace(" ", "").isalpha()


def _host_fact_needles(request: AdmissionRequest) -> tuple[str, ...]:
    facts = [fact.strip() for fact in request.host_facts]
    facts = [fact for fact in facts if len(fact) >= _MIN_HOST_FACT]
    facts += [
        scope_id
        for scope_id in (request.scope.tenant_id, request.scope.workspace_id)
        if _is_distinctive_id(scope_id)
    ]
    # Case-insensitive: a re-cased copy of an id or token is still the host's fact.
    return tuple(dict.fromkeys(fact.casefold() for fact in facts))


def _carries_host_fact(
    texts: Sequence[str], needles: Sequence[str], digests: HostFactDigests | None = None
) -> bool:
    for text in texts:
        if _GRANT_CLAIM.search(text):
            return True
        if needles:
            folded = text.casefold()
            if any(needle in folded for needle in needles):
                return True
        if digests is not None and _names_digested_fact(text, digests):
            return True
    return False


def _names_digested_fact(text: str, digests: HostFactDigests) -> bool:
    """Does a token-shaped run of ``text`` (a sentence's final dot aside) match a digest?"""
    for match in _TOKEN_RUN.finditer(text):
        run = match.group()
        if len(run) < _MIN_HOST_FACT:
            continue
        if any(digests.matches(form) for form in {run, run.rstrip("."), run.strip(".")}):
            return True
    return False


# --------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------


class BuiltinAdmissionPolicy:
    """The default admission policy: never-store content first, then host rules, then the mode.

    Implements ``engine.ports.AdmissionPolicy``. ``mode="manual"`` turns every decision that
    would accept into ``adjudication_required`` (resolved in the operations plane); rejections
    stay rejections. Instances are immutable and safe to share between threads.
    """

    policy_id: str = POLICY_ID

    def __init__(
        self,
        mode: Literal["auto", "manual"] = "auto",
        host_rules: Sequence[HostRule] = (),
        scanner: SecretScanner | None = None,
        *,
        near_duplicates: NearDuplicateAction = "pending_adjudication",
        near_duplicate_threshold: float = DEFAULT_NEAR_DUPLICATE_THRESHOLD,
        min_text_chars: int = DEFAULT_MIN_TEXT_CHARS,
    ) -> None:
        if mode not in ("auto", "manual"):
            raise ValueError("mode must be 'auto' or 'manual'")
        if near_duplicates not in ("pending_adjudication", "rejected", "off"):
            raise ValueError("near_duplicates must be 'pending_adjudication', 'rejected' or 'off'")
        if not 0 < near_duplicate_threshold <= 1:
            raise ValueError("near_duplicate_threshold must be in (0, 1]")
        if min_text_chars < 0:
            raise ValueError("min_text_chars must be 0 or more")
        rules = tuple(host_rules)
        if not all(
            isinstance(rule, DenyPattern | MaxTextBytes | RequireCitationScheme) for rule in rules
        ):
            raise TypeError("host_rules must hold HostRule models (see parse_host_rules)")
        _check_unique_names(rules)
        self._mode: Literal["auto", "manual"] = mode
        self._rules = rules
        self._scanner = scanner if scanner is not None else SecretScanner()
        self._near: NearDuplicateAction = near_duplicates
        self._threshold = float(near_duplicate_threshold)
        self._min_chars = min_text_chars
        quality = {
            "near_duplicates": near_duplicates,
            "threshold": self._threshold,
            "min_text_chars": min_text_chars,
            "method": f"minhash:shingle={SHINGLE},perm={NUM_PERM}",
        }
        self._version = _VERSION_PREFIX + _config_hash(
            mode, rules, self._scanner.fingerprint, quality
        )

    @property
    def mode(self) -> Literal["auto", "manual"]:
        """``auto`` accepts what passes every rule; ``manual`` asks for adjudication instead."""
        return self._mode

    @property
    def host_rules(self) -> tuple[HostRule, ...]:
        """The host's rules, in the order they are applied."""
        return self._rules

    def version(self) -> str:
        """``builtin-1:`` + 16 hex digits identifying the configuration.

        The digest covers the mode, the host rules and the scanner's fingerprint (detect-secrets
        version, plugin set, our rules), so any change to what the policy decides changes the
        version, and equal configurations always share one.
        """
        return self._version

    def anticipate(self, request: AdmissionRequest) -> None:
        """The secret scan of the candidate's strings and its text's signature and band keys,
        remembered for the admission expected next (``AnticipatingPolicy``): all are functions
        of the text, memoized per scope, so ``decide`` reads them back and decides as it would
        have."""
        subject = _subject(request)
        partition = memo_partition(request.scope.tenant_id, request.scope.workspace_id)
        self._scanner.first(subject.texts, partition)
        # Whatever ``near_duplicates`` says: the engine's sketch lookup cuts the bands too.
        band_keys("\n".join(subject.component_texts), partition=partition)

    def decide(self, request: AdmissionRequest) -> PolicyDecision:
        """Decide on one candidate; the returned ``rule`` names what decided, never content."""
        subject = _subject(request)
        partition = memo_partition(request.scope.tenant_id, request.scope.workspace_id)
        finding = self._scanner.first(subject.texts, partition)
        if finding is not None:
            return PolicyDecision("reject", f"secret:{finding.kind}")
        if _carries_host_fact(
            subject.texts, _host_fact_needles(request), request.host_fact_digests
        ):
            return PolicyDecision("reject", "host-fact")
        for rule in self._rules:
            if rule.violated_by(subject):
                return PolicyDecision("reject", f"host:{rule.name}")
        text = "\n".join(subject.component_texts)
        if low_information(text, self._min_chars):
            return PolicyDecision("reject", "low-information")
        if self._near != "off":
            similar = resembled(text, request.neighbours, self._threshold, partition=partition)
            if similar:
                verdict: Literal["reject", "adjudication_required"] = (
                    "reject" if self._near == "rejected" else "adjudication_required"
                )
                return PolicyDecision(
                    verdict, "near-duplicate", tuple(record_id for record_id, _ in similar)
                )
        if self._mode == "manual":
            return PolicyDecision("adjudication_required", "manual")
        return PolicyDecision("accept", "accept")


def _config_hash(
    mode: str,
    rules: Sequence[HostRule],
    scanner_fingerprint: str,
    quality: Mapping[str, Any],
) -> str:
    config = {
        "mode": mode,
        "quality": dict(quality),
        "rules": [rule.model_dump(mode="json") for rule in rules],
        "scanner": scanner_fingerprint,
    }
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


if TYPE_CHECKING:

    def _conforms(policy: BuiltinAdmissionPolicy) -> AdmissionPolicy:
        # Static check only: the class satisfies the engine's port structurally.
        return policy
