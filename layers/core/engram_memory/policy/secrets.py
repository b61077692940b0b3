"""In-process secret scanning for the built-in admission policy (CONTRACT.md §9).

The scanner runs the maintained ``detect-secrets`` detectors in-process: no files, no subprocess,
no network. It never touches the library's global settings (``transient_settings`` and
``scan_line`` mutate a process-wide singleton and clear shared caches, so they are not
thread-safe); instead it instantiates the plugins once and calls their pure ``analyze_string``,
which also means the library's optional network verification of found secrets never runs.

A finding carries the detector's type name only. The secret value, its position, the surrounding
text and any hash of them are dropped as soon as a detector answers, so nothing derived from the
content can leak through a finding, its ``repr``, a log line or a receipt.

Detectors
---------
From ``detect-secrets``, run over the whole text (their patterns describe single-line tokens, so
a multi-line PEM block is found by its header line): AWS access key ids and quoted secret keys,
Azure storage keys, Basic-Auth credentials in URLs (a user and a password before the host, as in
``postgres://`` or ``mongodb+srv://`` connection strings), Cloudant, Discord, GitHub (classic),
GitLab, IBM Cloud IAM, IBM COS HMAC, JWTs, Mailchimp, npm, OpenAI, PEM/PuTTY private keys, PyPI,
SendGrid, Slack, SoftLayer, Square, Stripe, Twilio.

The library's keyword detector (``password = ...``, ``secret: ...``, ``api_key = ...``,
``DATABASE_PASSWORD=...``, ``export AWS_SECRET_ACCESS_KEY=...``) is driven with the library's own
assignment patterns, one line at a time and within a bounded window after each keyword, with a
few false-positive guards for prose (see ``_KeywordDetector``).

Left off, on purpose:

- ``Base64HighEntropyString`` / ``HexHighEntropyString``: they flag every ``sha256:`` digest,
  record/candidate id and base64 blob a memory legitimately holds. The credential shapes they
  would catch are covered by the specific detectors and the keyword rules.
- ``IPPublicDetector``: an IP address is not a secret, and it matches dotted version numbers.
- ``ArtifactoryDetector``: matches ordinary upper-case model or part names (``APEX12345678``).
- ``TelegramBotTokenDetector``: unanchored ``\\d{8,10}:[\\w-]{35}`` matches references built from
  a millisecond timestamp and a slug (``1755350096789:some-long-locator-slug...``).

Rules of our own, only where the library has no detector (each documented at its definition):
encrypted/other PEM private-key headers, URL credentials the library's pattern misses, ``.env``
token/credential lines whose names the keyword list lacks (``*_TOKEN``, ``*_CREDENTIALS``...),
session cookies, HTTP authorization headers, and three well-known token prefixes (GitHub
fine-grained, Anthropic, Google API keys).
"""

from __future__ import annotations

import re
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

__all__ = ["SecretFinding", "SecretScanner"]

# Bumped whenever a rule of ours, a guard or the plugin selection changes: it feeds the
# fingerprint, and through it the admission policy's version.
RULES_VERSION: Final = "engram-secrets-1"

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
    OpenAIDetector,
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


# Plugins whose pattern backtracks quadratically, with a literal every match contains and how far
# a match can reach on either side of it. npm's `//.+/:_authToken=` took 12 s on a 64 KiB line of
# slashes, OpenAI's `sk-[\w-]*[A-Za-z0-9]{20}T3BlbkFJ...` 8 s on a text of `sk-`. These plugins
# run only on windows around the literal (see `_PluginDetector`). 256 characters is well beyond a
# real registry URL or OpenAI key prefix (~80 characters before the literal).
_PLUGIN_ANCHORS: Final[dict[type[Any], tuple[str, int]]] = {
    NpmDetector: ("_authToken", 256),
    OpenAIDetector: ("T3BlbkFJ", 256),
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

    Without an anchor the plugin runs over the whole text (the selected patterns describe
    single-line tokens, so this finds what a line-by-line scan would). With an anchor ``(literal, reach)`` it runs only on windows around the
    occurrences of ``literal``: each window spans ``reach`` characters before the literal and
    ``2 * reach`` after it, so it also covers every later occurrence within ``reach`` characters,
    which are skipped. Each character is then scanned a bounded number of times and a quadratic
    pattern costs ``O(len(text) * reach)`` instead of ``O(len(text) ** 2)``.
    """

    __slots__ = ("_anchor", "_plugin", "kind")

    def __init__(self, plugin: Any, anchor: tuple[str, int] | None = None) -> None:
        self._plugin = plugin
        self._anchor = anchor
        self.kind: str = str(plugin.secret_type)

    def _hit(self, text: str) -> bool:
        values: Iterator[str] = iter(self._plugin.analyze_string(text))
        return next(values, None) is not None

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
# `-----BEGIN ENCRYPTED PRIVATE KEY-----` and any other `<ALG> PRIVATE KEY` label; PuTTY keys of
# format 3 (the library knows the format 2 header only). Reported as the library's kind.
_PRIVATE_KEY_RULE: Final = _RegexRule(
    str(PrivateKeyDetector.secret_type),
    re.compile(r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-\d+:"),
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

# Token formats with a distinctive prefix that detect-secrets 1.5 does not know:
# GitHub fine-grained personal access tokens, Anthropic API keys, Google API keys.
_GITHUB_FINE_GRAINED_RULE: Final = _RegexRule(
    str(GitHubTokenDetector.secret_type), re.compile(r"github_pat_[A-Za-z0-9_]{22,}")
)
_ANTHROPIC_RULE: Final = _RegexRule(
    "Anthropic API Key", re.compile(r"sk-ant-[a-z]+\d{2}-[A-Za-z0-9_-]{20,}")
)
_GOOGLE_API_KEY_RULE: Final = _RegexRule("Google API Key", re.compile(r"AIza[0-9A-Za-z_-]{35}"))

_OWN_RULES: Final[tuple[_RegexRule, ...]] = (
    _PRIVATE_KEY_RULE,
    _URL_USERINFO_RULE,
    _ENV_RULE,
    _COOKIE_HEADER_RULE,
    _BARE_COOKIE_RULE,
    _AUTHORIZATION_RULE,
    _GITHUB_FINE_GRAINED_RULE,
    _ANTHROPIC_RULE,
    _GOOGLE_API_KEY_RULE,
)


def _library_version() -> str:
    try:
        return metadata.version("detect-secrets")
    except metadata.PackageNotFoundError:  # pragma: no cover - vendored or renamed install
        return "unknown"


class SecretScanner:
    """Finds secrets in texts with ``detect-secrets`` plus a few documented rules of our own.

    Build it once and share it: the detectors are created in ``__init__`` and hold only compiled
    patterns, and scanning keeps no state, so one instance is safe to use from many threads.
    """

    def __init__(self) -> None:
        # Library detectors first, then ours; the order only fixes the order of findings.
        detectors: list[_Detector] = [
            _PluginDetector(plugin(), _PLUGIN_ANCHORS.get(plugin)) for plugin in _LIBRARY_PLUGINS
        ]
        detectors.append(_JwtDetector())
        detectors.append(_KeywordDetector())
        detectors.extend(_OWN_RULES)
        self._detectors: tuple[_Detector, ...] = tuple(detectors)
        library_plugins = [plugin.__name__ for plugin in _LIBRARY_PLUGINS]
        library_plugins += ["JwtTokenDetector", "KeywordDetector"]
        self._fingerprint = "|".join(
            (f"detect-secrets=={_library_version()}", ",".join(library_plugins), RULES_VERSION)
        )

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
        for text in texts:
            for detector in self._detectors:
                if detector.kind not in seen and detector.found(text):
                    seen[detector.kind] = SecretFinding(detector.kind)
        return list(seen.values())

    def first(self, texts: Iterable[str]) -> SecretFinding | None:
        """The first finding ``scan`` would return, stopping as soon as one is found."""
        for text in texts:
            for detector in self._detectors:
                if detector.found(text):
                    return SecretFinding(detector.kind)
        return None
