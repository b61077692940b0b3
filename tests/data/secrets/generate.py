"""Generate the labelled secret corpus (``corpus.jsonl``) and its held-out twin (``holdout.jsonl``).

    python tests/data/secrets/generate.py          # rewrite both files
    python tests/data/secrets/generate.py --check  # exit 1 if a file differs from what it makes

Every secret-shaped string is synthetic: random, but in the real format of its provider (prefix,
alphabet, length, structure), drawn from ``random.Random`` with a fixed seed, so the files are
reproducible and nothing real is committed. Each line is one case::

    {"id": "...", "text": "...", "label": "secret" | "harmless", "kind": "...", "form": "..."}

``kind`` names the provider format (or the harmless look-alike), ``form`` how the text presents
it: ``plain`` (in a sentence), ``quoted_code``, ``lowercase``, ``spaced``, ``hyphenated``,
``zero_width``, ``fullwidth``, ``base64``, ``split_lines``, ``reversed``...

The held-out file uses another seed and, on top of the shared kinds and forms, kinds and forms
the main corpus never shows (``HOLDOUT_ONLY_KINDS``, ``HOLDOUT_ONLY_FORMS``). It is evaluated
only to report how well the rules generalize; the rules are never tuned on it.

Documentation example keys (AWS's ``AKIAIOSFODNN7EXAMPLE`` style, whose random part spells the
vendor's documented placeholder marker ``EXAMPLE``) are labelled ``harmless`` when quoted as
examples: they are published, grant nothing, and a note about them is legitimate memory. A key
with the marker inside a credential *assignment* (``aws_secret_access_key = ...``) is not in the
corpus: the keyword rule judges the assignment, not the value's provenance, and rejects it.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import string
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
CORPUS_SEED = 20260312
HOLDOUT_SEED = 770319

UPPER, LOWER, DIGITS = string.ascii_uppercase, string.ascii_lowercase, string.digits
ALNUM = UPPER + LOWER + DIGITS
BASE32 = UPPER + "234567"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"
ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff")

Case = dict[str, str]


class Maker:
    """Random, format-correct material from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chars(self, n: int, alphabet: str) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def pick(self, options: Sequence[str]) -> str:
        return self.rng.choice(list(options))

    def b64url_json(self, value: object) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def pem_body(self, prefix: str, lines: int) -> str:
        body = prefix + self.chars(64 * lines - len(prefix), B64)
        return "\n".join(body[i : i + 64] for i in range(0, len(body), 64))

    def url_password(self) -> str:
        # As a URL's userinfo holds it: reserved characters percent-encoded.
        return quote(self.password(), safe="")

    def password(self) -> str:
        word = self.pick(["Tr0ub4dor", "Sunset", "maple", "Kestrel", "orbit", "Velvet", "Quasar"])
        return word + self.chars(2, DIGITS) + self.pick("!#$%&*@?") + self.chars(3, ALNUM)


# --------------------------------------------------------------------------------------------
# Secret formats: kind -> token maker
# --------------------------------------------------------------------------------------------


def _slack_bot(m: Maker) -> str:
    return f"xoxb-{m.chars(12, DIGITS)}-{m.chars(13, DIGITS)}-{m.chars(24, ALNUM)}"


def _slack_user(m: Maker) -> str:
    return (
        f"xoxp-{m.chars(12, DIGITS)}-{m.chars(12, DIGITS)}-{m.chars(13, DIGITS)}-{m.chars(32, HEX)}"
    )


def _openai(m: Maker) -> str:
    legacy = "sk-" + m.chars(20, ALNUM) + "T3BlbkFJ" + m.chars(20, ALNUM)
    project = "sk-proj-" + m.chars(48, ALNUM + "_-") + "T3BlbkFJ" + m.chars(48, ALNUM + "_-")
    return m.pick([legacy, project])


TOKEN_KINDS: dict[str, Callable[[Maker], str]] = {
    "aws_access_key_id": lambda m: "AKIA" + m.chars(16, BASE32),
    "aws_secret_access_key": lambda m: m.chars(40, B64),
    "github_classic_pat": lambda m: "ghp_" + m.chars(36, ALNUM),
    "github_oauth_token": lambda m: "gho_" + m.chars(36, ALNUM),
    "github_app_token": lambda m: m.pick(["ghs_", "ghu_"]) + m.chars(36, ALNUM),
    "github_fine_grained_pat": lambda m: f"github_pat_{m.chars(22, ALNUM)}_{m.chars(59, ALNUM)}",
    "gitlab_pat": lambda m: "glpat-" + m.chars(20, ALNUM + "_-"),
    "slack_bot_token": _slack_bot,
    "stripe_secret_key": lambda m: m.pick(["sk_live_", "rk_live_"]) + m.chars(24, ALNUM),
    "google_api_key": lambda m: "AIza" + m.chars(35, ALNUM + "_-"),
    "openai_api_key": lambda m: _openai(m),
    "anthropic_api_key": lambda m: "sk-ant-api03-" + m.chars(93, ALNUM + "_-") + "AA",
    "twilio_api_key": lambda m: "SK" + m.chars(32, HEX),
    "sendgrid_api_key": lambda m: f"SG.{m.chars(22, ALNUM + '_-')}.{m.chars(43, ALNUM + '_-')}",
    "npm_token": lambda m: "npm_" + m.chars(36, ALNUM),
    "pypi_token": lambda m: "pypi-AgEIcHlwaS5vcmc" + m.chars(120, B64URL),
}
HOLDOUT_TOKEN_KINDS: dict[str, Callable[[Maker], str]] = {
    "aws_temporary_access_key_id": lambda m: "ASIA" + m.chars(16, BASE32),
    "github_refresh_token": lambda m: "ghr_" + m.chars(36, ALNUM),
    "slack_user_token": _slack_user,
    "gitlab_runner_token": lambda m: "glrt-" + m.chars(20, ALNUM + "_-"),
}

# Sentences a token is found in: some with a hint of what it is, some with none.
TOKEN_SENTENCES = (
    "here is the key {t} for staging",
    "{t}",
    "Deploy used {t} yesterday, rotate it after the demo.",
    "note to self: {t}",
    "the value we pasted in the chat was {t} and it worked",
    "Credentials for the CI job -> {t}",
    "remember {t} (from Ana)",
)
CODE_TEMPLATES = (
    'client = Client("{t}")',
    "const key = '{t}';",
    'config:\n  auth: "{t}"\n  region: eu-west-1',
    '{{"service": "billing", "value": "{t}"}}',
    "curl -H 'X-Custom: {t}' https://api.example.com/v1/items",
)


# Obfuscations of one token inside its sentence.
def _spaced(m: Maker, t: str) -> str:
    return " ".join(t)


def _hyphenated(m: Maker, t: str) -> str:
    return "-".join(t[i : i + 4] for i in range(0, len(t), 4))


def _zero_width(m: Maker, t: str) -> str:
    return "".join(c + (m.pick(ZERO_WIDTH) if i % 2 else "") for i, c in enumerate(t))


def _fullwidth(m: Maker, t: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in t)


def _split_lines(m: Maker, t: str) -> str:
    cut = m.rng.randrange(len(t) // 3, 2 * len(t) // 3)
    return t[:cut] + "\n" + t[cut:]


TOKEN_FORMS: dict[str, Callable[[Maker, str], str]] = {
    "plain": lambda m, t: t,
    "lowercase": lambda m, t: t.lower(),
    "spaced": _spaced,
    "hyphenated": _hyphenated,
    "zero_width": _zero_width,
    "fullwidth": _fullwidth,
    "split_lines": _split_lines,
    "reversed": lambda m, t: t[::-1],
}
HOLDOUT_TOKEN_FORMS: dict[str, Callable[[Maker, str], str]] = {
    "dotted": lambda m, t: ".".join(t[i : i + 5] for i in range(0, len(t), 5)),
    "soft_hyphens": lambda m, t: "\u00ad".join(t[i : i + 3] for i in range(0, len(t), 3)),
    "nbsp_spaced": lambda m, t: "\u00a0".join(t[i : i + 4] for i in range(0, len(t), 4)),
    "lowercase_spaced": lambda m, t: " ".join(t.lower()),
    "split_three_lines": lambda m, t: "\n".join(t[i : i + 16] for i in range(0, len(t), 16)),
}
# Whole-text encodings.
TEXT_FORMS: dict[str, Callable[[str], str]] = {
    "base64": lambda s: base64.b64encode(s.encode()).decode(),
}
HOLDOUT_TEXT_FORMS: dict[str, Callable[[str], str]] = {
    "hex": lambda s: s.encode().hex(),
    "base64url": lambda s: base64.urlsafe_b64encode(s.encode()).rstrip(b"=").decode(),
}


def _token_cases(
    m: Maker,
    kinds: dict[str, Callable[[Maker], str]],
    forms: dict[str, Callable[[Maker, str], str]],
    text_forms: dict[str, Callable[[str], str]],
    with_code: bool,
) -> Iterator[tuple[str, str, str]]:
    for kind, make in kinds.items():
        if with_code:
            yield kind, "quoted_code", m.pick(CODE_TEMPLATES).format(t=make(m))
        for form, obfuscate in forms.items():
            if kind == "aws_secret_access_key" and form == "plain":
                # A bare key and one named in prose; the quoted-in-code form is above.
                yield kind, "bare", make(m)
                yield kind, "plain", f"the AWS secret for the backup user is {make(m)}"
                continue
            yield kind, form, m.pick(TOKEN_SENTENCES).format(t=obfuscate(m, make(m)))
        for form, encode in text_forms.items():
            yield kind, form, encode(m.pick(TOKEN_SENTENCES).format(t=make(m)))


# --------------------------------------------------------------------------------------------
# Structured secrets: PEM blocks, JWTs, connection strings, webhooks, passwords
# --------------------------------------------------------------------------------------------

PEM_LABELS = {
    "pem_rsa_private_key": ("RSA PRIVATE KEY", "MIIEowIBAAKCAQEA"),
    "pem_pkcs8_private_key": ("PRIVATE KEY", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
    "openssh_private_key": ("OPENSSH PRIVATE KEY", "b3BlbnNzaC1rZXktdjEAAAAA"),
    "pem_encrypted_private_key": ("ENCRYPTED PRIVATE KEY", "MIIFHzBJBgkqhkiG9w0BBQ0wPDAb"),
}
HOLDOUT_PEM_LABELS = {"pem_ec_private_key": ("EC PRIVATE KEY", "MHcCAQEEI")}


def _pem(m: Maker, label: str, prefix: str, header_case: Callable[[str], str] = str) -> str:
    dashes = "-" * 5
    begin, end = header_case(f"BEGIN {label}"), header_case(f"END {label}")
    return f"{dashes}{begin}{dashes}\n{m.pem_body(prefix, 5)}\n{dashes}{end}{dashes}"


def _pem_cases(m: Maker, labels: dict[str, tuple[str, str]]) -> Iterator[tuple[str, str, str]]:
    for kind, (label, prefix) in labels.items():
        yield kind, "plain", f"Server key follows:\n{_pem(m, label, prefix)}\nthanks"
        yield kind, "lowercase_header", _pem(m, label, prefix, str.lower)
        yield kind, "zero_width", _zero_width(m, _pem(m, label, prefix))
        yield kind, "fullwidth", _fullwidth(m, _pem(m, label, prefix))
        yield kind, "base64", base64.b64encode(_pem(m, label, prefix).encode()).decode()
        yield kind, "reversed", _pem(m, label, prefix)[::-1]
        yield kind, "quoted_code", 'KEY = """' + _pem(m, label, prefix) + '"""'


def _jwt(m: Maker) -> str:
    header = m.b64url_json({"alg": m.pick(["HS256", "RS256", "ES256"]), "typ": "JWT"})
    claims = {"sub": f"user-{m.chars(6, DIGITS)}", "iat": 1_760_000_000 + m.rng.randrange(10**7)}
    signature = m.chars(43 if "HS" in header else 86, B64URL)
    return f"{header}.{m.b64url_json(claims)}.{signature}"


def _jwt_cases(
    m: Maker, forms: dict[str, Callable[[Maker, str], str]]
) -> Iterator[tuple[str, str, str]]:
    yield "jwt", "plain", f"the id token was {_jwt(m)} yesterday"
    yield "jwt", "quoted_code", f'headers = {{"Authorization": "Bearer {_jwt(m)}"}}'
    jwt = _jwt(m)
    dot = jwt.index(".")
    yield "jwt", "split_lines", f"token:\n{jwt[: dot + 1]}\n{jwt[dot + 1 :]}"
    yield "jwt", "split_lines", f"{jwt[:30]}\n{jwt[30:]}"
    for form in ("spaced", "zero_width", "fullwidth", "reversed", "hyphenated"):
        if form in forms:
            yield "jwt", form, f"session {forms[form](m, _jwt(m))}"
    yield "jwt", "base64", base64.b64encode(f"cookie was {_jwt(m)}".encode()).decode()


def _db_url(m: Maker, scheme: str) -> str:
    user = m.pick(["app", "admin", "reader", "svc_report"])
    host = m.pick(["db.internal", "10.0.3.7", "cluster0.ab1cd.mongodb.net", "pg-prod.example.net"])
    return f"{scheme}://{user}:{m.url_password()}@{host}:{m.pick(['5432', '27017', '3306', '6379'])}/main"


def _url_cases(m: Maker, schemes: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    for scheme in schemes:
        yield "db_connection_url", "plain", f"DATABASE_URL is {_db_url(m, scheme)}"
        yield "db_connection_url", "quoted_code", f'engine = create_engine("{_db_url(m, scheme)}")'
    yield "db_connection_url", "zero_width", f"use {_zero_width(m, _db_url(m, 'postgresql'))}"
    yield "db_connection_url", "fullwidth", f"use {_fullwidth(m, _db_url(m, 'postgres'))}"
    yield "db_connection_url", "base64", base64.b64encode(_db_url(m, "mongodb").encode()).decode()
    yield "db_connection_url", "empty_user", f"cache at redis://:{m.url_password()}@cache:6379/0"
    for _ in range(2):
        yield (
            "basic_auth_url",
            "plain",
            (
                f"clone from https://{m.pick(['deploy', 'ana', 'ci-bot'])}:{m.url_password()}@git.example.com/repo.git"
            ),
        )
    yield (
        "basic_auth_url",
        "quoted_code",
        f'requests.get("https://admin:{m.url_password()}@intranet.local/api")',
    )


def _azure(m: Maker) -> str:
    key = base64.b64encode(bytes(m.rng.randrange(256) for _ in range(64))).decode()
    return (
        f"DefaultEndpointsProtocol=https;AccountName=st{m.chars(10, LOWER + DIGITS)};"
        f"AccountKey={key};EndpointSuffix=core.windows.net"
    )


def _slack_webhook(m: Maker) -> str:
    return (
        f"https://hooks.slack.com/services/T{m.chars(10, UPPER + DIGITS)}/"
        f"B{m.chars(10, UPPER + DIGITS)}/{m.chars(24, ALNUM)}"
    )


def _service_cases(m: Maker) -> Iterator[tuple[str, str, str]]:
    yield "azure_storage_connection_string", "plain", f"storage: {_azure(m)}"
    yield "azure_storage_connection_string", "quoted_code", f'conn = "{_azure(m)}"'
    yield "azure_storage_connection_string", "zero_width", _zero_width(m, _azure(m))
    yield "azure_storage_connection_string", "base64", base64.b64encode(_azure(m).encode()).decode()
    yield "azure_storage_connection_string", "split_lines", _split_lines(m, _azure(m))
    yield "slack_webhook", "plain", f"post alerts to {_slack_webhook(m)}"
    yield "slack_webhook", "quoted_code", f'WEBHOOK = "{_slack_webhook(m)}"'
    yield "slack_webhook", "zero_width", _zero_width(m, _slack_webhook(m))
    yield "slack_webhook", "fullwidth", _fullwidth(m, _slack_webhook(m))
    yield "slack_webhook", "base64", base64.b64encode(_slack_webhook(m).encode()).decode()


PROSE_PASSWORDS = (
    "my gmail password is {p}",
    "The wifi password is {p} — don't share it.",
    "Ana's password for the router is {p}",
    "the admin password was changed to {p} on Monday",
    "Login: ana@example.com / password {p}",
    "use the passphrase '{p}' to unlock the backup",
    "Bank PIN and password: {p}",
    "password for the VPN = {p}",
    "I set the database password to {p}",
    "minha senha do banco é {p}",
    'The password is "{p}".',
    "her laptop password: {p} (temporary)",
)
CONFIG_PASSWORDS = (
    'password: "{p}"',
    "DB_PASSWORD={p}",
    '{{"user": "ana", "password": "{p}"}}',
    "db:\n  user: app\n  password: {p}\n  host: localhost",
    "spring.datasource.password={p}",
    "export PGPASSWORD={p}",
    '<add key="SmtpPassword" value="{p}" />',
    "MYSQL_ROOT_PASSWORD: {p}",
)


def _password_cases(m: Maker, prose: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    for template in prose:
        yield "password", "prose", template.format(p=m.password())
    for template in CONFIG_PASSWORDS:
        yield "password", "config", template.format(p=m.password())
    yield "password", "zero_width", _zero_width(m, f"password={m.password()}")
    yield "password", "base64", base64.b64encode(f"password: {m.password()}".encode()).decode()


# --------------------------------------------------------------------------------------------
# Harmless look-alikes
# --------------------------------------------------------------------------------------------


def _hash_hex(m: Maker, n: int) -> str:
    return m.chars(n, HEX)


def _uuid(m: Maker) -> str:
    h = m.chars(32, HEX)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{m.pick('89ab')}{h[17:20]}-{h[20:]}"


ORDINARY_SENTENCES = (
    "I went to the park with my kids on Sunday and we talked about school.",
    "The meeting moved to Thursday at 3pm; bring the quarterly numbers.",
    "Caroline said the support group helped her a lot last spring.",
    "Remember to water the basil and the tomatoes before leaving.",
    "The train to Lisbon leaves at 08:15 from platform 4.",
    "Our team shipped the new onboarding flow after two sprints.",
    "Melanie painted a lake at sunrise and hung it in the hallway.",
    "Buy oat milk, eggs, spinach and two lemons.",
)
PASSWORD_PROSE = (
    "Remember to reset your password tomorrow; the old one expires.",
    "My password is something I never share with anyone.",
    "the password is in the vault under 'bank'",
    "my password is incorrect, so the login failed twice",
    "Passwords must be at least 12 characters long.",
    "I forgot my password again and had to use the reset link.",
    "The password manager syncs between my phone and laptop.",
    "He changed his password after the phishing email.",
    "Use a passphrase of four random words instead of a short password.",
    "The secret to good bread is patience.",
    "Secretary: Jane Doe",
    "The secret: practice every single day.",
    "API keys are rotated every 90 days by the platform team.",
    "Ask Bruno for the token when the CI job needs one.",
    "password: see the vault entry",
    "senha: pergunte ao Bruno",
    "I typed the wrong password three times and got locked out.",
    "Slovakia and Wallachia were on the itinerary.",
)
ENGLISH_WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "garden",
    "pencil",
    "window",
    "orange",
    "silver",
    "market",
    "bridge",
    "forest",
    "planet",
    "candle",
    "rocket",
    "meadow",
    "harbor",
    "falcon",
    "copper",
    "violet",
]


def _harmless_cases(m: Maker) -> Iterator[tuple[str, str, str]]:
    for _ in range(4):
        yield "sha256_hex", "plain", f"sha256:{_hash_hex(m, 64)}"
        yield "sha1_hex", "plain", f"sha1 of the file is {_hash_hex(m, 40)}"
        yield "git_commit_sha", "plain", f"fixed in commit {_hash_hex(m, 40)} on main"
        yield "md5_hex", "plain", f"md5 {_hash_hex(m, 32)}  archive.tar.gz"
        yield "uuid", "plain", f"request {_uuid(m)} failed"
    yield "git_commit_sha", "short", f"see {_hash_hex(m, 7)} and {_hash_hex(m, 7)}"
    yield "git_commit_sha", "uppercase", _hash_hex(m, 40).upper()
    yield "git_commit_sha", "spaced", " ".join(_hash_hex(m, 7) for _ in range(6))
    yield "sha256_hex", "split_lines", f"{_hash_hex(m, 32)}\n{_hash_hex(m, 32)}"
    yield "sha512_hex", "plain", _hash_hex(m, 128)
    yield "uuid", "uppercase", _uuid(m).upper()
    yield "uuid", "list", ", ".join(_uuid(m) for _ in range(3))
    yield "uuid", "compact", _uuid(m).replace("-", "")
    digest = base64.b64encode(bytes(m.rng.randrange(256) for _ in range(32))).decode()
    yield "sri_integrity", "plain", f'integrity="sha256-{digest}"'
    yield "docker_digest", "plain", f"image app@sha256:{_hash_hex(m, 64)}"
    for _ in range(2):
        yield (
            "doc_example_key",
            "plain",
            f"The AWS docs use AKIA{m.chars(9, BASE32)}EXAMPLE as a sample key id.",
        )
    yield (
        "doc_example_key",
        "plain",
        "e.g. aws configure with the example key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    )
    yield "doc_example_key", "bare", "AKIAIOSFODNN7EXAMPLE"
    yield (
        "doc_example_key",
        "placeholder",
        "set OPENAI_API_KEY to your key, e.g. sk-... (never commit it)",
    )
    yield "doc_example_key", "placeholder", "token: <YOUR_GITHUB_TOKEN>"
    yield "doc_example_key", "placeholder", 'api_key = "${STRIPE_SECRET_KEY}"'
    for sentence in ORDINARY_SENTENCES:
        yield "base64_text", "base64", base64.b64encode(sentence.encode()).decode()
    yield (
        "base64_text",
        "base64_json",
        base64.b64encode(b'{"name": "ana", "role": "editor"}').decode(),
    )
    yield "base64_text", "jwt_like_segment", m.b64url_json({"user": "ana", "theme": "dark"})
    yield "base64_text", "hex", ORDINARY_SENTENCES[0].encode().hex()
    yield "random_id", "nanoid", f"order {m.chars(21, ALNUM + '_-')} shipped"
    yield "random_id", "base62", f"share link https://example.com/s/{m.chars(22, ALNUM)}"
    yield "random_id", "ulid", f"event {m.chars(26, '0123456789ABCDEFGHJKMNPQRSTVWXYZ')}"
    yield "random_id", "objectid", f'{{"_id": "{m.chars(24, HEX)}"}}'
    yield (
        "random_id",
        "stripe_object_id",
        f"customer cus_{m.chars(14, ALNUM)} paid invoice in_{m.chars(24, ALNUM)}",
    )
    yield (
        "random_id",
        "stripe_publishable_key",
        f"pk_live_{m.chars(24, ALNUM)} goes in the web page",
    )
    yield (
        "random_id",
        "youtube",
        f"watch https://www.youtube.com/watch?v={m.chars(11, ALNUM + '_-')}",
    )
    yield (
        "random_id",
        "twilio_account_sid_like",
        f"ticket TCK-{m.chars(8, UPPER + DIGITS)}-{m.chars(4, DIGITS)}",
    )
    yield (
        "random_id",
        "camel_identifier",
        "AbstractSingletonProxyFactoryBeanResolver42 is a class name",
    )
    yield "random_id", "product_code", "-".join(m.chars(4, UPPER + DIGITS) for _ in range(4))
    for version in ("v1.24.3", "2.0.0-rc.1+build.5", "Python 3.11.9", "node v22.11.0", "1.2.3.4"):
        yield "version_string", "plain", f"upgraded to {version} today"
    for sentence in PASSWORD_PROSE:
        yield "prose_keyword", "plain", sentence
    for sentence in ORDINARY_SENTENCES:
        yield "ordinary_text", "plain", sentence
    yield "ordinary_text", "spaced", "N A S A and the U S A"
    yield "ordinary_text", "split_lines", "Dear Ana,\nthanks for the\nlovely dinner.\nBest, Bo"
    yield "ordinary_text", "zero_width", "emoji family 👨\u200d👩\u200d👧 and the word caf\u00e9"
    yield "ordinary_text", "fullwidth", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ １２３"
    yield "ordinary_text", "reversed", ORDINARY_SENTENCES[1][::-1]
    yield "ordinary_text", "words", " ".join(m.pick(ENGLISH_WORDS) for _ in range(12))
    yield "url", "no_password", "https://ana@example.com/profile and http://localhost:8080/health"
    yield "url", "no_password", "postgres://localhost:5432/app?sslmode=require"
    yield "url", "no_password", "https://example.com/reset?token=&user=ana"
    yield (
        "public_key",
        "ssh",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + m.chars(43, B64) + " ana@laptop",
    )
    yield (
        "public_key",
        "pem_public",
        _pem(m, "PUBLIC KEY", "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"),
    )
    yield (
        "public_key",
        "certificate",
        _pem(m, "CERTIFICATE", "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBa"),
    )
    yield "misc", "timestamps", "2026-08-16T12:34:56.789Z, 2024-01-02 and 1755350096789"
    yield "misc", "network", "MAC 3c:22:fb:7a:11:09, IPv6 2001:db8::ff00:42:8329, host 203.0.113.7"
    yield "misc", "colors", "#1e90ff #ff6347 rgb(34, 139, 34)"


HOLDOUT_HARMLESS = (
    ("sha384_sri", "plain"),
    ("pgp_public_key", "plain"),
    ("ordinary_text", "hex_ids"),
)


def _holdout_harmless(m: Maker) -> Iterator[tuple[str, str, str]]:
    digest = base64.b64encode(bytes(m.rng.randrange(256) for _ in range(48))).decode()
    yield "sha384_sri", "plain", f'<script integrity="sha384-{digest}"></script>'
    yield "pgp_public_key", "plain", _pem(m, "PGP PUBLIC KEY BLOCK", "mQINBF")
    yield "ordinary_text", "hex_ids", " ".join(_hash_hex(m, 12) for _ in range(5))
    yield "ordinary_text", "plain", "Das Passwort ist zu kurz, sagte der Server."
    yield "prose_keyword", "plain", "what is the password policy for contractors?"
    yield "random_id", "base62", m.chars(32, ALNUM)


# --------------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------------


def build(seed: int, holdout: bool) -> list[Case]:
    m = Maker(seed)
    kinds = dict(TOKEN_KINDS) | (HOLDOUT_TOKEN_KINDS if holdout else {})
    forms = dict(TOKEN_FORMS) | (HOLDOUT_TOKEN_FORMS if holdout else {})
    text_forms = dict(TEXT_FORMS) | (HOLDOUT_TEXT_FORMS if holdout else {})
    rows: list[tuple[str, str, str, str]] = []
    secrets: list[Iterator[tuple[str, str, str]]] = [
        _token_cases(m, kinds, forms, text_forms, with_code=True),
        _pem_cases(m, PEM_LABELS | (HOLDOUT_PEM_LABELS if holdout else {})),
        _jwt_cases(m, forms),
        _url_cases(
            m, ("postgres", "mongodb+srv", "mysql") if holdout else ("postgres", "mongodb+srv")
        ),
        _service_cases(m),
        _password_cases(m, PROSE_PASSWORDS),
    ]
    for source in secrets:
        rows.extend(("secret", *case) for case in source)
    rows.extend(("harmless", *case) for case in _harmless_cases(m))
    if holdout:
        rows.extend(("harmless", *case) for case in _holdout_harmless(m))
    cases = []
    for index, (label, kind, form, text) in enumerate(rows):
        cases.append(
            {
                "id": f"{label[0]}{index:04d}",
                "text": text,
                "label": label,
                "kind": kind,
                "form": form,
            }
        )
    return cases


def render(cases: list[Case]) -> str:
    return "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases)


OUTPUTS = {"corpus.jsonl": (CORPUS_SEED, False), "holdout.jsonl": (HOLDOUT_SEED, True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, (seed, holdout) in OUTPUTS.items():
        text = render(build(seed, holdout))
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale:", ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
