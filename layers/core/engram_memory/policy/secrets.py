"""In-process secret scanning for the built-in admission policy (CONTRACT.md §9).

The scanner runs the maintained ``detect-secrets`` detectors in-process: no files, no subprocess,
no network. It never touches the library's global settings (``transient_settings`` and
``scan_line`` mutate a process-wide singleton and clear shared caches, so they are not
thread-safe); instead it instantiates the plugins once and calls their pure ``analyze_string``,
which also means the library's optional network verification of found secrets never runs.

A finding carries the detector's type name only. The secret value, its position, the surrounding
text and any hash of them are dropped as soon as a detector answers, so nothing derived from the
content can leak through a finding, its ``repr``, a log line or a receipt.

Views
-----
Every text is examined as given and then through de-obfuscated views (``views.py``), lazily, so
``first`` stops at the first view with a finding: normalized (NFKC, format characters removed),
joined (spaced or line-split tokens), dehyphenated, reversed, decoded (base64/base64url/hex blobs
that decode to text). The text itself and the full views (normalized, decoded) get every
detector; the format views (joined, dehyphenated, reversed) only the detectors of a token's own
shape, because gluing or reversing words would make up context for the keyword rules.

Detectors
---------
From ``detect-secrets``, run over the whole text (their patterns describe single-line tokens, so
a multi-line PEM block is found by its header line): AWS access key ids and quoted secret keys,
Azure storage keys, Basic-Auth credentials in URLs (a user and a password before the host, as in
``postgres://`` or ``mongodb+srv://`` connection strings), Cloudant, Discord, GitHub (classic),
GitLab, IBM Cloud IAM, IBM COS HMAC, JWTs, Mailchimp, npm, PEM/PuTTY private keys, PyPI,
SendGrid, Slack, SoftLayer, Square, Stripe, Twilio. The costly context plugins (IBM, Cloudant,
SoftLayer, Mailchimp, keyword) run only when the text holds a word every one of their matches
contains (``_Gated``).

The library's keyword detector (``password = ...``, ``secret: ...``, ``api_key = ...``,
``DATABASE_PASSWORD=...``, ``export AWS_SECRET_ACCESS_KEY=...``) is driven with the library's own
assignment patterns, one line at a time and within a bounded window after each keyword, with a
few false-positive guards for prose (see ``_KeywordDetector``).

Left off, on purpose:

- ``Base64HighEntropyString`` / ``HexHighEntropyString``: they flag every ``sha256:`` digest,
  record/candidate id and base64 blob a memory legitimately holds. The credential shapes they
  would catch are covered by the specific detectors, the keyword rules and the bare AWS secret
  rule (which adds checks a digest fails).
- ``IPPublicDetector``: an IP address is not a secret, and it matches dotted version numbers.
- ``ArtifactoryDetector``: matches ordinary upper-case model or part names (``APEX12345678``).
- ``TelegramBotTokenDetector``: unanchored ``\\d{8,10}:[\\w-]{35}`` matches references built from
  a millisecond timestamp and a slug (``1755350096789:some-long-locator-slug...``).
- ``OpenAIDetector``: quadratic on long runs of ``sk-``; replaced by a linear rule that widens it.

Rules of our own, only where the library has no detector or misses a presentation (each
documented at its definition): PEM private-key headers in any case and label, URL credentials the
library's pattern misses, ``.env`` token/credential lines whose names the keyword list lacks
(``*_TOKEN``, ``*_CREDENTIALS``...), session cookies, HTTP authorization headers, configuration
elements naming a credential (``<add key="...Password" value="..."/>``), passwords stated in
prose, a bare 40-character AWS secret key, and provider token formats matched in any letter case
and with their prefix hyphens optional (AWS, GitHub classic and fine-grained, GitLab, Slack,
Stripe, OpenAI, Anthropic, Google, Twilio, SendGrid, npm, PyPI).

AWS's documentation placeholders (keys holding the marker ``EXAMPLE``) are not findings: they
grant nothing, and a real key cannot hold the marker (see ``_not_a_documented_placeholder``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final, Protocol

from detect_secrets.filters.heuristic import (
    is_potential_uuid,
    is_prefixed_with_dollar_sign,
    is_templated_secret,
)
from detect_secrets.plugins import keyword as _ds_keyword
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from engram_memory.policy.views import derived_views

__all__ = ["SecretFinding", "SecretScanner"]

# Bumped whenever a rule of ours, a guard or the plugin selection changes: it feeds the
# fingerprint, and through it the admission policy's version.
RULES_VERSION: Final = "engram-secrets-2"

# detect-secrets regex plugins run as shipped (JWT and keyword have drivers of their own below),
# in this order, which only fixes the order of findings: the first finding, and hence the rule
# that decides, is deterministic.
_LIBRARY_PLUGINS: Final[tuple[type[Any], ...]] = (
    PrivateKeyDetector,
    AWSKeyDetector,
    AzureStorageKeyDetector,
    BasicAuthDetector,
    GitHubTokenDetector,
    GitLabTokenDetector,
    SlackDetector,
    StripeDetector,
    NpmDetector,
    PypiTokenDetector,
    SendGridDetector,
    SquareOAuthDetector,
    TwilioKeyDetector,
    MailchimpDetector,
    DiscordBotTokenDetector,
    IbmCloudIamDetector,
    IbmCosHmacDetector,
    CloudantDetector,
    SoftlayerDetector,
)


# Plugins that read a keyword or an assignment around the secret (IBM, Cloudant, SoftLayer, npm's
# `.npmrc` line) or whose pattern is a bare character class (Mailchimp's 32 `[0-9a-z]`): they run
# on full views only, never on the joined, dehyphenated or reversed ones.
_LIBRARY_CONTEXT_PLUGINS: Final[frozenset[type[Any]]] = frozenset(
    {
        NpmDetector,
        MailchimpDetector,
        IbmCloudIamDetector,
        IbmCosHmacDetector,
        CloudantDetector,
        SoftlayerDetector,
    }
)


# Plugins whose pattern backtracks quadratically, with a literal every match contains and how far
# a match can reach on either side of it. npm's `//.+/:_authToken=` took 12 s on a 64 KiB line of
# slashes. These plugins run only on windows around the literal (see `_PluginDetector`). 256
# characters is well beyond a real registry URL. (OpenAI's plugin, quadratic too, is replaced by
# a linear rule of ours: see `_FORMAT_RULES`.)
_PLUGIN_ANCHORS: Final[dict[type[Any], tuple[str, int]]] = {
    NpmDetector: ("_authToken", 256),
}


def _not_a_documented_placeholder(value: str) -> bool:
    """False for AWS's documented placeholder keys (``AKIA`` + 9 characters + ``EXAMPLE``...).

    AWS writes every example key of its documentation with the marker ``EXAMPLE`` inside the key
    itself; a real key id (16 random base-32 characters) or secret (40 random base-64 characters)
    holds that 7-letter word with a probability below 1e-9. A placeholder grants nothing, and a
    note about one is legitimate memory. Only the matched key is examined, so a real key written
    next to the word ``EXAMPLE`` is still a key.
    """
    folded = value.upper()
    return "EXAMPLE" not in folded and "ELPMAXE" not in folded  # also as the reversed view reads


# Plugins whose found values are filtered before they count.
_PLUGIN_VALUE_FILTERS: Final[dict[type[Any], Callable[[str], bool]]] = {
    AWSKeyDetector: _not_a_documented_placeholder,
}


@dataclass(frozen=True, slots=True)
class SecretFinding:
    """One detected secret, identified by the detector's type name only.

    It deliberately holds no value, position, excerpt or hash of the secret: a finding may be
    logged, counted or turned into a decision rule without ever echoing what was found.
    """

    kind: str


class _Detector(Protocol):
    kind: str

    def found(self, text: str) -> bool:
        """True when ``text`` contains at least one secret of this detector's kind."""
        ...


class _PluginDetector:
    """A ``detect-secrets`` regex plugin run through ``analyze_string``.

    ``analyze_string`` only applies the plugin's compiled patterns (plus pure checks such as the
    JWT well-formedness test); unlike ``analyze_line`` it never reads the global settings nor
    triggers the plugin's network verification.

    ``accept``, when given, filters the values the plugin found (see ``_PLUGIN_VALUE_FILTERS``).

    Without an anchor the plugin runs over the whole text (the selected patterns describe
    single-line tokens, so this finds what a line-by-line scan would). With an anchor ``(literal, reach)`` it runs only on windows around the
    occurrences of ``literal``: each window spans ``reach`` characters before the literal and
    ``2 * reach`` after it, so it also covers every later occurrence within ``reach`` characters,
    which are skipped. Each character is then scanned a bounded number of times and a quadratic
    pattern costs ``O(len(text) * reach)`` instead of ``O(len(text) ** 2)``.
    """

    __slots__ = ("_accept", "_anchor", "_plugin", "kind")

    def __init__(
        self,
        plugin: Any,
        anchor: tuple[str, int] | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> None:
        self._plugin = plugin
        self._anchor = anchor
        self._accept = accept
        self.kind: str = str(plugin.secret_type)

    def _hit(self, text: str) -> bool:
        values: Iterator[str] = iter(self._plugin.analyze_string(text))
        if self._accept is None:
            return next(values, None) is not None
        return any(self._accept(value) for value in values)

    def found(self, text: str) -> bool:
        if self._anchor is None:
            return self._hit(text)
        literal, reach = self._anchor
        covered_to = -1  # occurrences at or before this index lie in the last window's reach
        at = text.find(literal)
        while at != -1:
            if at > covered_to:
                end = at + len(literal) + 2 * reach
                if self._hit(text[max(0, at - reach) : end]):
                    return True
                covered_to = at + reach
            at = text.find(literal, at + 1)
        return False


class _Gated:
    """A detector run only when the lower-cased text holds one of the literals every match needs.

    Several detectors are costly on long ordinary text (case-insensitive alternations tried at
    every position: ~0.5-1.5 ms per 4 KiB each) although each of their matches must contain one
    of a few words (``key``, ``pass``, ``cookie``...). Looking for those words first is a fast
    substring scan and skips the detector on text that cannot match, without changing what it
    finds: each gate below lists literals that every match of its detector contains.
    """

    __slots__ = ("_detector", "_literals", "kind")

    def __init__(self, detector: _Detector, literals: tuple[str, ...]) -> None:
        self._detector = detector
        self._literals = literals
        self.kind = detector.kind

    def found(self, text: str) -> bool:
        folded = text.lower()
        if not any(literal in folded for literal in self._literals):
            return False
        return self._detector.found(text)


# The words every match of these detectors contains (read off their patterns): the IBM, Cloudant
# and SoftLayer assignment patterns need a `key|pw|pwd|pass|password|token` name (or, for their
# URL forms, the service's host name); Mailchimp keys end in `-us<n>`; the keyword list's entries
# all contain `key`, `pass`, `pwd`, `secret` or `contrase`.
_CREDENTIAL_NAME_WORDS: Final = ("key", "pw", "pass", "token", "cloudant", "softlayer")
_PLUGIN_GATES: Final[dict[type[Any], tuple[str, ...]]] = {
    IbmCloudIamDetector: _CREDENTIAL_NAME_WORDS,
    IbmCosHmacDetector: _CREDENTIAL_NAME_WORDS,
    CloudantDetector: _CREDENTIAL_NAME_WORDS,
    SoftlayerDetector: _CREDENTIAL_NAME_WORDS,
    MailchimpDetector: ("-us",),
}
_KEYWORD_GATE: Final = ("key", "pass", "pwd", "secret", "contrase")


class _JwtDetector:
    """``detect-secrets``' JWT plugin, run only on the spans that can hold a JWT.

    The plugin's pattern ``eyJ[\\w=-]+\\.`` is retried from every ``eyJ`` of a run that no dot
    ends, which is quadratic (a 64 KiB ``eyJeyJ...`` took a second). ``_JWT_CANDIDATE`` finds the
    same places in linear time: it starts only at the beginning of a run of token characters,
    commits (atomic group) to the run's first ``eyJ``, and needs the run to continue and be
    followed by ``.`` and another token character, exactly the plugin's first two segments.
    The plugin (pattern plus its base64/JSON well-formedness check) then runs on that span.
    """

    __slots__ = ("_plugin", "kind")

    def __init__(self) -> None:
        self._plugin = JwtTokenDetector()
        self.kind: str = str(JwtTokenDetector.secret_type)

    def found(self, text: str) -> bool:
        for candidate in _JWT_CANDIDATE.finditer(text):
            tail = _JWT_TAIL.match(text, candidate.end())
            span = text[candidate.start() : tail.end() if tail else candidate.end()]
            if next(iter(self._plugin.analyze_string(span)), None) is not None:
                return True
        return False


_JWT_CHAR: Final = r"[A-Za-z0-9_=-]"
_JWT_CANDIDATE: Final = re.compile(
    rf"(?<!{_JWT_CHAR})(?>{_JWT_CHAR}*?eyJ){_JWT_CHAR}++\.{_JWT_CHAR}"
)
# The rest of the plugin's match: the payload segment and an optional dot. (The plugin's pattern
# ends with a lazy `[...]*?`, so its matches never include the signature: its validity check
# decodes the header and payload only.) Handing it more would make the scan quadratic again.
_JWT_TAIL: Final = re.compile(rf"{_JWT_CHAR}*+\.?")


class _RegexRule:
    """A rule of our own: a compiled pattern plus an optional check of each match."""

    __slots__ = ("_accept", "_pattern", "kind")

    def __init__(
        self,
        kind: str,
        pattern: re.Pattern[str],
        accept: Callable[[re.Match[str]], bool] | None = None,
    ) -> None:
        self.kind = kind
        self._pattern = pattern
        self._accept = accept

    def found(self, text: str) -> bool:
        if self._accept is None:
            return self._pattern.search(text) is not None
        return any(self._accept(match) for match in self._pattern.finditer(text))


# --------------------------------------------------------------------------------------------
# The keyword detector, driven with the library's assignment patterns
# --------------------------------------------------------------------------------------------

# Where a keyword can start. The library's own prefilter shape (`(keyword)\w*`), so the keyword
# token we inspect (`password_secure`, `secret_id`, `Secretary`) is exactly what it would see.
_KEYWORD_START: Final = re.compile(_ds_keyword.DENYLIST_REGEX, re.IGNORECASE)

# The library's assignment patterns that read naturally outside source code, with the group
# that holds the value (the group before it always holds the optional opening quote).
# `FOLLOWED_BY_COLON_REGEX` is the only one that accepts an unquoted value after a colon, the one
# prose can produce ("The secret: practice daily"), hence the third field.
_ASSIGNMENTS: Final[tuple[tuple[re.Pattern[str], int, bool], ...]] = (
    (_ds_keyword.FOLLOWED_BY_COLON_REGEX, 4, True),
    (_ds_keyword.FOLLOWED_BY_EQUAL_SIGNS_REGEX, 5, False),
    (_ds_keyword.FOLLOWED_BY_COLON_EQUAL_SIGNS_REGEX, 4, False),
    (_ds_keyword.FOLLOWED_BY_ARROW_FUNCTION_SIGN_QUOTES_REQUIRED_REGEX, 4, False),
    (_ds_keyword.FOLLOWED_BY_QUOTES_AND_SEMICOLON_REGEX, 3, False),
)

# How far after a keyword the assignment is looked for. Bounding it keeps the scan linear: the
# library's value pattern is greedy to the end of the line, so an unbounded match per keyword
# would be quadratic on a long line full of keywords. 256 characters holds any real key name,
# operator and the start of its value.
_KEYWORD_WINDOW: Final = 256

# English words that merely start with a keyword ("Secretary: Jane", "secretly: ...").
_BENIGN_KEYWORD_WORDS: Final = re.compile(
    r"secret(?:ar(?:y|ies|iat\w*)|ly|ive\w*|ions?|e[ds]?|ing)|passwordless\w*",
    re.IGNORECASE,
)
# Key names that name *about* a secret rather than hold one (`secret_id`, `password_hint`,
# `secret_name`, `password_manager`...). `_ids?` is the library's own id heuristic.
_REFERENCE_KEY_SUFFIX: Final = re.compile(
    r"_(?:ids?|names?|arns?|refs?|path|file|hint|policy|length|len|manager|reset|rotation|"
    r"version|type)$",
    re.IGNORECASE,
)
# Whole values that are configuration literals, not secrets (`secret: false`, `password: null`).
_NON_SECRET_LITERALS: Final = frozenset(
    {"true", "false", "null", "none", "nil", "undefined", "redacted", "[redacted]", "required"}
)


class _KeywordDetector:
    """``detect-secrets``' keyword detector (type ``Secret Keyword``), adapted to prose.

    For each keyword occurrence the library's assignment patterns are tried anchored at the
    keyword, limited to the keyword's line and ``_KEYWORD_WINDOW`` characters. A match counts
    unless one of these guards says it is not a value being assigned:

    - the keyword token is an ordinary word (``Secretary``) or names a reference to a secret
      (``secret_id``, ``password_hint``);
    - the value is a template or a variable reference (``${DB_PASSWORD}``, ``<password>``,
      ``$PASSWORD``), is a UUID, or is a literal such as ``false``/``null`` (the library's own
      heuristic filters, plus the literal list);
    - the form is ``keyword: value`` with an unquoted value that reads as a sentence: its first
      word is letters only and more words follow (``The secret: practice every day``). A single
      token (``Password: hunter2``) or a first token with digits or symbols still counts.
    """

    __slots__ = ("kind",)

    def __init__(self) -> None:
        self.kind: str = str(_ds_keyword.KeywordDetector.secret_type)

    def found(self, text: str) -> bool:
        for keyword in _KEYWORD_START.finditer(text):
            token = keyword.group(0)
            if _BENIGN_KEYWORD_WORDS.fullmatch(token) or _REFERENCE_KEY_SUFFIX.search(token):
                continue
            start = keyword.start()
            end = min(len(text), start + _KEYWORD_WINDOW)
            for line_break in ("\n", "\r"):
                at = text.find(line_break, start, end)
                if at != -1:
                    end = at
            for pattern, group, colon_form in _ASSIGNMENTS:
                match = pattern.match(text, start, end)
                if match is not None and _is_assigned_value(match, group, colon_form):
                    return True
        return False


def _is_assigned_value(match: re.Match[str], group: int, colon_form: bool) -> bool:
    value = (match.group(group) or "").strip()
    if not value:
        return False
    # The library's `is_not_alphanumeric_string` filter is not applied: it would let numeric
    # passwords (`pin=48213377`) through, and the value pattern already requires a word character.
    if (
        is_templated_secret(value)
        or is_prefixed_with_dollar_sign(value)
        or is_potential_uuid(value)
    ):
        return False
    if value.rstrip(".,;").lower() in _NON_SECRET_LITERALS:
        return False
    quoted = bool(match.group(group - 1))
    if colon_form and not quoted:
        words = value.split()
        if len(words) > 1 and words[0].isalpha():
            return False
    return True


# --------------------------------------------------------------------------------------------
# Rules of our own (only where detect-secrets has no detector)
# --------------------------------------------------------------------------------------------

# PEM private keys whose header the library's fixed list misses: PKCS#8
# `-----BEGIN ENCRYPTED PRIVATE KEY-----` and any other `<ALG> PRIVATE KEY` label, in any letter
# case and with the spaces optional (a lower-cased header, or one whose spaces a joined view
# removed); PuTTY keys of any format version (the library knows the format 2 header only).
# Public keys and certificates (`BEGIN PUBLIC KEY`, `BEGIN CERTIFICATE`) do not match. Reported as
# the library's kind.
_PRIVATE_KEY_RULE: Final = _RegexRule(
    str(PrivateKeyDetector.secret_type),
    re.compile(
        r"---[ \t]*BEGIN[ A-Z0-9]{0,40}?PRIVATE ?KEY(?: ?BLOCK)?[ \t]*---"
        r"|PuTTY-User-Key-File-\d+:",
        re.IGNORECASE,
    ),
)

# Credentials in a URL's userinfo that the library's Basic-Auth pattern misses: an empty user
# name (`redis://:password@host:6379`), or a password holding RFC 3986 sub-delimiters, which are
# legal unencoded in userinfo and common in passwords (`postgres://app:Sup3r!pw@db/app`); the
# library excludes `!$&'()*+,;=`. Only the generic delimiters `/?#[]@` (and a `:` in the user
# name) end a part, so `https://host:443/path` does not match. Reported as the library's kind.
_URL_USERINFO_RULE: Final = _RegexRule(
    str(BasicAuthDetector.secret_type),
    re.compile(r"(?<=[A-Za-z0-9])://[^\s:/?#\[\]@]*:[^\s/?#\[\]@]+@"),
)

# `.env` lines (optionally `export`ed) whose variable name says it holds a credential, for the
# names the library's keyword list lacks (`GITHUB_TOKEN`, `GOOGLE_CREDENTIALS`, `APP_PASSPHRASE`,
# `AWS_ACCESS_KEY`...). Names that describe a secret rather than hold one (`*_PATH`, `*_TTL`,
# `*_ID`...) are skipped, and the value must look like a token: at least 8 characters and not a
# single plain word or number (`TOKEN_ISSUER=google`, `PASSWORD_ROUNDS=12`).
_ENV_LINE: Final = re.compile(
    r"^[ \t]*(?:export[ \t]+)?([A-Z][A-Z0-9_]*)[ \t]*=[ \t]*[\"']?([^\s\"'#]+)", re.MULTILINE
)
_ENV_SENSITIVE_NAME: Final = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|PWD|PASS|PASSPHRASE|APIKEY|API_KEY|ACCESS_KEY|"
    r"PRIVATE_KEY|SIGNING_KEY|ENCRYPTION_KEY|MASTER_KEY|CREDENTIALS?)(?:_|$)"
)
_ENV_REFERENCE_NAME: Final = re.compile(
    r"_(?:PATH|FILE|DIR|URL|URI|HOST|PORT|NAME|ID|TTL|TIMEOUT|EXPIRY|EXPIRES|LENGTH|TYPE|REGION|"
    r"ENABLED|ENDPOINT|HEADER|ISSUER|AUDIENCE|ROUNDS)$"
)
_PLAIN_VALUE: Final = re.compile(r"[a-z]+|[A-Z]+|[0-9]+")


def _env_line_holds_secret(match: re.Match[str]) -> bool:
    name, value = match.group(1), match.group(2)
    if not _ENV_SENSITIVE_NAME.search(name) or _ENV_REFERENCE_NAME.search(name):
        return False
    if len(value) < 8 or _PLAIN_VALUE.fullmatch(value):
        return False
    return not (is_prefixed_with_dollar_sign(value) or is_templated_secret(value))


_ENV_RULE: Final = _RegexRule("Environment Secret", _ENV_LINE, _env_line_holds_secret)

# Session cookies. A `Cookie:` / `Set-Cookie:` header counts when one of its cookies has a
# session-like name (`session`, `sid`, `token`, `auth`, `jwt`, `remember`, `csrf`, `__Host-`...)
# and a value, or any value of 16+ opaque characters; `Set-Cookie` attributes (`Path=/`,
# `Max-Age=0`) are not cookies. Outside headers, the well-known session cookie names assigned an
# 8+ character value (`PHPSESSID=...`, `connect.sid=...`) count too.
_COOKIE_HEADER: Final = re.compile(r"(?<![\w-])(set-)?cookie[ \t]*:[ \t]*([^\r\n]+)", re.IGNORECASE)
_SESSION_COOKIE_NAME: Final = re.compile(
    r"sess|sid|token|auth(?!or)|jwt|login|remember|csrf|xsrf|^__(?:host|secure)-", re.IGNORECASE
)
_OPAQUE_COOKIE_VALUE: Final = re.compile(r"[A-Za-z0-9%._~+/=-]{16,}")
_SET_COOKIE_ATTRIBUTES: Final = frozenset(
    {"path", "domain", "expires", "max-age", "samesite", "secure", "httponly", "priority"}
)
_BARE_SESSION_COOKIE: Final = re.compile(
    r"(?<![\w.-])(?:PHPSESSID|JSESSIONID|ASP\.NET_SessionId|connect\.sid|laravel_session|"
    r"_session_id|sessionid|session_id|sessid)=[\"']?[A-Za-z0-9%._~+/-]{8,}",
    re.IGNORECASE,
)


def _cookie_header_holds_session(match: re.Match[str]) -> bool:
    pairs = match.group(2).split(";")
    if match.group(1):  # Set-Cookie: the first pair is the cookie, the rest are attributes
        pairs = pairs[:1]
    for pair in pairs:
        name, equals, value = pair.partition("=")
        name, value = name.strip(), value.strip().strip("\"'")
        if not equals or not name or not value or name.lower() in _SET_COOKIE_ATTRIBUTES:
            continue
        if _SESSION_COOKIE_NAME.search(name) or _OPAQUE_COOKIE_VALUE.fullmatch(value):
            return True
    return False


_COOKIE_HEADER_RULE: Final = _RegexRule(
    "Session Cookie", _COOKIE_HEADER, _cookie_header_holds_session
)
_BARE_COOKIE_RULE: Final = _RegexRule("Session Cookie", _BARE_SESSION_COOKIE)

# HTTP credentials in headers: `Authorization: Bearer|Basic|Token|... <credential>`, API-key
# headers (`X-API-Key: ...`), and a bare `Bearer <20+ token characters>`. JWT bearer tokens are
# also found by the JWT detector; this rule catches the opaque ones.
_AUTHORIZATION_RULE: Final = _RegexRule(
    "Authorization Header",
    re.compile(
        r"(?<![\w-])(?:proxy-)?authorization[ \t]*[:=][ \t]*[\"']?"
        r"(?:bearer|basic|token|digest|apikey|sso-key|negotiate)[ \t]+[A-Za-z0-9._~+/=-]{8,}"
        r"|(?<![\w-])(?:x-api-key|x-auth-token|x-access-token|api-key|x-goog-api-key|"
        r"x-amz-security-token)[ \t]*:[ \t]*[\"']?[A-Za-z0-9._~+/=-]{8,}"
        r"|(?-i:(?<![\w-])Bearer[ \t]+[A-Za-z0-9._~+/-]{20,})",
        re.IGNORECASE,
    ),
)


# Token formats with a distinctive prefix, written to also accept the presentations the
# de-obfuscated views produce (see `views.py`): any letter case (a token pasted lower-cased), and
# the hyphens of a prefix optional (the dehyphenated view removes them). Where detect-secrets 1.5
# has the format, these only widen it and report its kind; GitHub fine-grained tokens, npm tokens
# outside `.npmrc`, Anthropic and Google API keys are formats it does not know. A match must not
# follow a letter or digit, and the fixed-length formats must not be followed by one, so a longer
# identifier that merely contains a prefix does not match.
class _FoldedRule:
    """A lower-case pattern matched against the lower-cased text.

    Folding the text once instead of compiling with ``re.IGNORECASE`` keeps the pattern's leading
    literal, which the regex engine searches for with a fast scan (~5 us per 4 KiB instead of
    ~300 us); the left boundary is checked after the fact for the same reason.
    """

    __slots__ = ("_accept", "_pattern", "kind")

    def __init__(
        self, kind: str, pattern: str, accept: Callable[[str], bool] | None = None
    ) -> None:
        self.kind = kind
        self._pattern = re.compile(pattern)
        self._accept = accept

    def found(self, text: str) -> bool:
        folded = text.lower()
        for match in self._pattern.finditer(folded):
            start = match.start()
            if start and folded[start - 1].isascii() and folded[start - 1].isalnum():
                continue
            if self._accept is None or self._accept(match.group(0)):
                return True
        return False


_FORMAT_RULES: Final[tuple[_FoldedRule, ...]] = (
    _FoldedRule(
        str(AWSKeyDetector.secret_type),
        r"(?:akia|asia|abia|acca|a3t[a-z0-9])[a-z0-9]{16}(?![a-z0-9])",
        _not_a_documented_placeholder,
    ),
    _FoldedRule(str(GitHubTokenDetector.secret_type), r"gh[pousr]_[a-z0-9]{36}(?![a-z0-9])"),
    _FoldedRule(str(GitHubTokenDetector.secret_type), r"github_pat_[a-z0-9]{22}_[a-z0-9]{59}"),
    _FoldedRule(
        str(GitLabTokenDetector.secret_type), r"gl(?:pat|dt|ft|soat|rt|cbt|ptt|oas)-?[a-z0-9_-]{17}"
    ),
    # Slack tokens whose hyphens the dehyphenated view removed (the library has the hyphenated).
    _FoldedRule(str(SlackDetector.secret_type), r"xox[abposr][0-9]{8,40}[a-z0-9]{8}"),
    _FoldedRule(str(StripeDetector.secret_type), r"[rs]k_live_[a-z0-9]{24}"),
    # An OpenAI key is one run of token characters starting `sk` and holding `T3BlbkFJ` (base64 of
    # "OpenAI"). This replaces the library's plugin (`sk-[\w-]*[A-Za-z0-9]{20}T3BlbkFJ...`, which
    # it widens): that pattern is quadratic, and even run on windows around the literal it took
    # 0.7 s on a 64 KiB run of `sk-T3BlbkFJ`. Matching the run possessively is linear.
    _FoldedRule(
        str(OpenAIDetector.secret_type),
        r"sk(?<![a-z0-9]sk)[a-z0-9_-]*+",
        lambda run: "t3blbkfj" in run.lower() and len(run) >= 30,
    ),
    _FoldedRule("Anthropic API Key", r"sk-?ant-?[a-z]{3,8}[0-9]{2}-?[a-z0-9_-]{20}"),
    _FoldedRule("Google API Key", r"aiza[a-z0-9_-]{30}"),
    _FoldedRule(str(TwilioKeyDetector.secret_type), r"(?:sk|ac)[0-9a-f]{32}(?![a-z0-9])"),
    _FoldedRule(str(SendGridDetector.secret_type), r"sg\.[a-z0-9_-]{16,32}\.[a-z0-9_-]{30}"),
    _FoldedRule(str(NpmDetector.secret_type), r"npm_[a-z0-9]{36}(?![a-z0-9])"),
    _FoldedRule(
        str(PypiTokenDetector.secret_type),
        r"pypi-?(?:ageichlwas5vcmc|agendgvzdc5wexbplm9yzw)[a-z0-9_-]{50}",
    ),
)


# A bare AWS secret access key: 40 characters of the base64 alphabet standing alone, which the
# library finds only when quoted after an `aws...key` name. Forty random base64 characters are
# told apart from the 40-character strings a memory holds for other reasons by:
# - a letter and a digit (a random key lacks either with probability < 1e-3);
# - not hexadecimal (git commit and SHA-1 digests are 40 hex digits);
# - Shannon entropy >= 3.7 bits per character (random keys: >= 4.1, lower-cased >= 3.78 in 10^5
#   draws; `aaaa...1111` strings fall below);
# - not reading as words: when 24+ of the 40 characters are words (`[A-Z]?[a-z]{3,}`), it is a
#   camelCase identifier (`getUserAccountSettingsForTenantById2024x`: 28); a random key reaches
#   24 with probability 1e-3 (2 * 10^5 draws). A lower-cased key is all words by that measure, so
#   the check applies only to strings that have upper-case letters;
# - not base64 of printable text (30 bytes of text encode to exactly 40 characters; the decoded
#   view examines that text itself);
# - not one of AWS's documented placeholders (`..EXAMPLEKEY`).
_BARE_AWS_SECRET: Final = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_HEX_ONLY: Final = re.compile(r"[0-9A-Fa-f]+")
_WORD: Final = re.compile(r"[A-Z]?[a-z]{3,}")
_WORDY_CHARACTERS: Final = 24


def _shannon_bits(value: str) -> float:
    length = len(value)
    return -sum(count / length * math.log2(count / length) for count in Counter(value).values())


def _is_bare_aws_secret(match: re.Match[str]) -> bool:
    value = match.group(0)
    digits = sum(char.isdigit() for char in value)
    if digits == 0 or digits == len(value) or _HEX_ONLY.fullmatch(value):
        return False
    if not any(char.isalpha() for char in value) or _shannon_bits(value) < 3.7:
        return False
    if not value.islower() and sum(map(len, _WORD.findall(value))) >= _WORDY_CHARACTERS:
        return False
    if not _not_a_documented_placeholder(value):
        return False
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return True
    return not decoded.isprintable()


_BARE_AWS_SECRET_RULE: Final = _RegexRule(
    str(AWSKeyDetector.secret_type), _BARE_AWS_SECRET, _is_bare_aws_secret
)


# A password stated in prose: "my gmail password is Kestrel24!gEx", "the password for the router
# is ...", "password for the VPN = ...", "minha senha do banco é ...", "Login: ana / password X".
# After each password word (English, Portuguese, Spanish, German, French), up to six words are
# read on the same line; the value is the word after a copula (`is`, `was`, `to`, `=`, `:`, `é`,
# `ist`...), or the very next word when it is strongly password-like. A value counts only when it
# looks like a password rather than a word: 6 to 64 characters and, after a copula, a digit and
# another character class or three classes (three and a digit or symbol without a copula, see
# `_password_like`); digits alone count after a copula
# ("the password is 4821" is too short; "the password is 48213377" is not). "My password is
# something I never share" and "the password is in the vault" pass.
# Matched in the lower-cased text (see `_FoldedRule` for why); the left boundary is checked after.
_PASSWORD_WORD: Final = re.compile(
    r"(?:pass(?:word|phrase|code)|passwd|pwd|senha|contrase[ñn]a|passwort|mot de passe)s?(?!\w)"
)
_COPULAS: Final = frozenset(
    {"is", "was", "are", "were", "be", "to", "=", ":", "->", "é", "era", "es", "ist", "war", "est"}
)
_PROSE_WINDOW: Final = 160
_PROSE_WORDS: Final = 6
_QUOTES: Final = "\"'`“”‘’«»"


def _password_like(word: str, after_copula: bool) -> bool:
    value = word.strip(_QUOTES).rstrip(".,;)").strip(_QUOTES)
    if not 6 <= len(value) <= 64 or "://" in value:
        return False
    if is_templated_secret(value) or is_prefixed_with_dollar_sign(value) or value[0] in "<{%":
        return False  # `${DB_PASSWORD}`, `<password>`, `{{ secret }}`, `%(password)s`
    if value.isdigit():
        return after_copula
    classes = (
        any(char.islower() for char in value),
        any(char.isupper() for char in value),
        any(char.isdigit() for char in value),
        any(not char.isalnum() for char in value),
    )
    # After a copula: a digit and another class (`hunter2`), or three classes (`P@ssword`); a word
    # with a hyphen (`min-length`) is not enough. Without one, three classes and a digit or symbol.
    if after_copula:
        return (classes[2] and sum(classes) >= 2) or sum(classes) >= 3
    return (classes[2] or classes[3]) and sum(classes) >= 3


class _ProsePasswordDetector:
    """A password stated in a sentence (see the comment above ``_PASSWORD_WORD``)."""

    __slots__ = ("kind",)

    def __init__(self) -> None:
        self.kind = "Password In Prose"

    def found(self, text: str) -> bool:
        folded = text.lower()
        if len(folded) != len(text):  # a rare letter whose lower case is longer: keep indices
            text = folded
        for keyword in _PASSWORD_WORD.finditer(folded):
            if keyword.start() and folded[keyword.start() - 1].isalnum():
                continue
            window = text[keyword.end() : keyword.end() + _PROSE_WINDOW].split("\n", 1)[0]
            if _stated_value(window):
                return True
        return False


def _stated_value(window: str) -> bool:
    rest = window.lstrip()
    if rest[:1] in (":", "="):  # `password: X`, `password=X`
        words = rest[1:].split()
        return bool(words) and _password_like(words[0], after_copula=True)
    words = rest.split()[: _PROSE_WORDS + 1]
    if words and _password_like(words[0], after_copula=False):
        return True
    for index, word in enumerate(words[:-1]):
        if word.lower() in _COPULAS or word.endswith(":"):
            if _password_like(words[index + 1], after_copula=True):
                return True
        elif word[-1] in ".;!?":  # the sentence ended before any value was stated
            return False
    return False


# Key/value configuration elements naming a credential (.NET `<add key="SmtpPassword"
# value="..."/>`, `<param name="apiToken" value="..."/>`): the keyword detector reads `key = value`
# shapes, not a name attribute followed by a value attribute.
_CONFIG_ATTRIBUTE_RULE: Final = _RegexRule(
    str(_ds_keyword.KeywordDetector.secret_type),
    re.compile(
        r"(?:key|name)[ \t]*=[ \t]*[\"'][^\"'\n]{0,64}?(?:password|passwd|pwd|secret|token|api_?key)"
        r"[^\"'\n]{0,32}[\"'][ \t]+value[ \t]*=[ \t]*[\"'](?![$<{])[^\"'\n]{4,256}[\"']",
        re.IGNORECASE,
    ),
)

# Rules that read context (a keyword, a header name, a sentence): full views only.
# Gated like the costly library plugins (see `_Gated`): every cookie header names `cookie`, every
# well-known session cookie name contains `sess` or `sid`, and every authorization pattern needs
# one of the header words listed.
_CONTEXT_RULES: Final[tuple[_Detector, ...]] = (
    _ENV_RULE,
    _Gated(_COOKIE_HEADER_RULE, ("cookie",)),
    _Gated(_BARE_COOKIE_RULE, ("sess", "sid")),
    _Gated(
        _AUTHORIZATION_RULE,
        ("authorization", "api-key", "auth-token", "access-token", "security-token", "bearer"),
    ),
    _Gated(_CONFIG_ATTRIBUTE_RULE, ("value",)),
)
# Rules of a token's own shape: every view.
_SHAPE_RULES: Final[tuple[_Detector, ...]] = (
    _PRIVATE_KEY_RULE,
    _URL_USERINFO_RULE,
    *_FORMAT_RULES,
    _BARE_AWS_SECRET_RULE,
)


def _library_version() -> str:
    try:
        return metadata.version("detect-secrets")
    except metadata.PackageNotFoundError:  # pragma: no cover - vendored or renamed install
        return "unknown"


# How many texts' answers a scanner remembers (``SecretScanner.first``): past it the memo starts
# over, so its memory stays bounded (~100 bytes an entry).
_MEMO_ENTRIES: Final = 8192


class SecretScanner:
    """Finds secrets in texts with ``detect-secrets`` plus a few documented rules of our own.

    Build it once and share it: the detectors are created in ``__init__`` and hold only compiled
    patterns, and the only state is ``first``'s memo (one dict operation at a time), so one
    instance is safe to use from many threads.
    """

    def __init__(self) -> None:
        # Library detectors first, then ours; the order only fixes the order of findings.
        shape: list[_Detector] = [
            _PluginDetector(
                plugin(), _PLUGIN_ANCHORS.get(plugin), _PLUGIN_VALUE_FILTERS.get(plugin)
            )
            for plugin in _LIBRARY_PLUGINS
            if plugin not in _LIBRARY_CONTEXT_PLUGINS
        ]
        shape.append(_JwtDetector())
        shape.extend(_SHAPE_RULES)
        context: list[_Detector] = []
        for plugin in _LIBRARY_PLUGINS:
            if plugin in _LIBRARY_CONTEXT_PLUGINS:
                detector: _Detector = _PluginDetector(plugin(), _PLUGIN_ANCHORS.get(plugin))
                gate = _PLUGIN_GATES.get(plugin)
                context.append(detector if gate is None else _Gated(detector, gate))
        context.append(_Gated(_KeywordDetector(), _KEYWORD_GATE))
        context.append(_ProsePasswordDetector())
        context.extend(_CONTEXT_RULES)
        # Full views get every detector; format views (joined, dehyphenated, reversed) only the
        # detectors of a token's own shape (see `views.py`).
        self._shape_detectors: tuple[_Detector, ...] = tuple(shape)
        self._detectors: tuple[_Detector, ...] = (*shape, *context)
        library_plugins = [plugin.__name__ for plugin in _LIBRARY_PLUGINS]
        library_plugins += ["JwtTokenDetector", "KeywordDetector"]
        self._fingerprint = "|".join(
            (f"detect-secrets=={_library_version()}", ",".join(library_plugins), RULES_VERSION)
        )
        # `first`'s answers by keyed digest of (partition, text): the kind found first, or "".
        # The key is random, made here and never written anywhere, so the memo holds no text
        # and nothing a reader without this process's memory could match a guess against.
        self._memo: dict[bytes, str] = {}
        self._memo_key = os.urandom(32)

    def _examinations(self, text: str) -> Iterator[tuple[str, tuple[_Detector, ...]]]:
        """The text and its derived views, each with the detectors that apply to it, lazily."""
        yield text, self._detectors
        for view in derived_views(text):
            yield view.text, self._detectors if view.full else self._shape_detectors

    @property
    def fingerprint(self) -> str:
        """Identifies the detection behaviour: library version, plugin set and our rules.

        Policies fold it into their version, so upgrading the scanner changes the policy version.
        """
        return self._fingerprint

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind this scanner can report, in detection order, without repeats."""
        return tuple(dict.fromkeys(detector.kind for detector in self._detectors))

    def scan(self, texts: Iterable[str]) -> list[SecretFinding]:
        """Return one finding per kind of secret present in ``texts``, in a stable order.

        The order is by text, then by detector; a kind found again later is not repeated (a
        finding has nothing but its kind, so repeats would carry no information).
        """
        seen: dict[str, SecretFinding] = {}
        for text in _distinct(texts):
            for view, detectors in self._examinations(text):
                for detector in detectors:
                    if detector.kind not in seen and detector.found(view):
                        seen[detector.kind] = SecretFinding(detector.kind)
        return list(seen.values())

    def first(self, texts: Iterable[str], partition: str = "") -> SecretFinding | None:
        """The first finding ``scan`` would return, stopping as soon as one is found.

        A text's answer is remembered, keyed by ``partition`` (the admission policy passes the
        tenant and workspace) and a keyed digest of the text: a record repeats the same short
        strings in every capture (``citation:turn``, a purpose, a scheme), and an admission
        scanned each, all views and detectors, every time (half the scan of a typical pair).
        The answer is a function of the text alone, so remembering it changes no decision; the
        partition keeps one workspace's scans from making another's faster, which would tell an
        agent what texts another workspace holds.
        """
        for text in _distinct(texts):
            kind = self._first_kind(text, partition)
            if kind:
                return SecretFinding(kind)
        return None

    def _first_kind(self, text: str, partition: str) -> str:
        """The kind of ``text``'s first finding, "" for none: from the memo, or scanned."""
        key = hashlib.blake2b(
            f"{len(partition)}:{partition}:{text}".encode("utf-8", "surrogatepass"),
            key=self._memo_key,
            digest_size=16,
        ).digest()
        kind = self._memo.get(key)
        if kind is None:
            kind = self._scan_first(text)
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = kind
        return kind

    def _scan_first(self, text: str) -> str:
        for view, detectors in self._examinations(text):
            for detector in detectors:
                if detector.found(view):
                    return detector.kind
        return ""


def _distinct(texts: Iterable[str]) -> Iterator[str]:
    """``texts`` without repeats, in order. The scan is a function of the text alone, so a
    repeat can add no finding and cannot move the first one; a record repeats many strings
    (``citation:turn`` once per citation), each a full pass of every detector and view."""
    seen: set[str] = set()
    for text in texts:
        if text not in seen:
            seen.add(text)
            yield text
