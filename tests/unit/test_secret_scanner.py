"""Behaviour of the in-process secret scanner (CONTRACT.md §9).

Every fake secret is assembled at runtime so that this file itself holds no secret-shaped literal
(and does not trip a repository secret scan).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import string
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from detect_secrets.settings import get_settings

from engram_memory.policy.secrets import SecretFinding, SecretScanner

_ALNUM = string.ascii_letters + string.digits


def _random(length: int, alphabet: str = _ALNUM, seed: int = 7) -> str:
    rng = random.Random(f"{seed}:{length}:{alphabet}")
    return "".join(rng.choice(alphabet) for _ in range(length))


def _b64url(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _jwt() -> str:
    header = _b64url({"alg": "HS256", "typ": "JWT"})
    payload = _b64url({"sub": "user-42", "iat": 1755350096})
    return f"{header}.{payload}.{_random(43, _ALNUM + '-_')}"


def _pem(label: str) -> str:
    dashes = "-" * 5
    body = "\n".join(_random(64, _ALNUM + "+/", seed=line) for line in range(6))
    return f"{dashes}BEGIN {label}{dashes}\n{body}\n{dashes}END {label}{dashes}"


def _aws_secret_key() -> str:
    return _random(40, _ALNUM + "/+")


def _kw(*parts: str) -> str:
    """Join key-name pieces (kept apart so the source holds no assignment-shaped literal)."""
    return "".join(parts)


PASSWORD = _kw("pass", "word")
SECRET = _kw("sec", "ret")
PASSPHRASE = " ".join(["correct", "horse", "battery", "staple"])


def _secret_cases() -> list[tuple[str, str, str, str]]:
    """(id, text, secret value that must never be echoed, expected kind)."""
    akia = "AKIA" + "Z" * 16
    aws_secret = _aws_secret_key()
    pem_body_key = _pem(_kw("RSA PRIVATE", " KEY"))
    jwt = _jwt()
    db_credential = "Sup3r" + _random(10) + "!"
    cookie = _random(24, string.ascii_lowercase + string.digits)
    return [
        ("aws access key id", f"the key is {akia} for prod", akia, "AWS Access Key"),
        (
            "aws secret key (quoted, in a config snippet)",
            f'aws_{SECRET}_access_key = "{aws_secret}"',
            aws_secret,
            "AWS Access Key",
        ),
        (
            "aws secret key exported in a shell",
            f"export AWS_{SECRET.upper()}_ACCESS_KEY={aws_secret}",
            aws_secret,
            "Secret Keyword",
        ),
        (
            "pem private key block inside a longer text",
            f"Here is the deploy key, keep it safe:\n{pem_body_key}\nThanks, see you Monday.",
            pem_body_key.splitlines()[1],
            "Private Key",
        ),
        (
            "encrypted pkcs8 private key block",
            "key follows\n" + _pem(_kw("ENCRYPTED PRIVATE", " KEY")),
            _pem(_kw("ENCRYPTED PRIVATE", " KEY")).splitlines()[1],
            "Private Key",
        ),
        (
            "openssh private key block",
            _pem(_kw("OPENSSH PRIVATE", " KEY")),
            _pem(_kw("OPENSSH PRIVATE", " KEY")).splitlines()[1],
            "Private Key",
        ),
        ("github classic token", "use ghp_" + _random(36), "ghp_" + _random(36), "GitHub Token"),
        (
            "github fine-grained token",
            "github_pat_" + _random(22) + "_" + _random(59),
            _random(59),
            "GitHub Token",
        ),
        ("gitlab token", "glpat-" + _random(20), "glpat-" + _random(20), "GitLab Token"),
        (
            "slack bot token",
            "xoxb-" + "1234567890" + "-" + "9876543210" + "-" + _random(24).lower(),
            _random(24).lower(),
            "Slack Token",
        ),
        (
            "stripe live key",
            "stripe key " + "sk_" + "live_" + _random(24),
            "sk_" + "live_" + _random(24),
            "Stripe Access Key",
        ),
        (
            "openai key",
            "sk-proj-" + _random(20) + "T3Blbk" + "FJ" + _random(20, seed=8),
            _random(20, seed=8),
            "OpenAI Token",
        ),
        ("jwt", f"the id token was {jwt} yesterday", jwt, "JSON Web Token"),
        (
            "postgres connection string",
            f"DATABASE_URL is postgres://app:{db_credential}@db.internal:5432/app",
            db_credential,
            "Basic Auth Credentials",
        ),
        (
            "mongodb+srv connection string",
            f"mongodb+srv://reader:{db_credential}@cluster0.example.net/test?retryWrites=true",
            db_credential,
            "Basic Auth Credentials",
        ),
        (
            "redis url with an empty user",
            f"redis://:{db_credential}@cache:6379/0",
            db_credential,
            "Basic Auth Credentials",
        ),
        ("password= assignment", f"{PASSWORD}={db_credential}", db_credential, "Secret Keyword"),
        ("numeric password assignment", f"{PASSWORD}=48213377", "48213377", "Secret Keyword"),
        ("secret: assignment", f"{SECRET}: {db_credential}", db_credential, "Secret Keyword"),
        ("api_key = assignment", f"api_key = {db_credential}", db_credential, "Secret Keyword"),
        (
            "password in a json body",
            json.dumps({"user": "ana", PASSWORD: PASSPHRASE}),
            PASSPHRASE,
            "Secret Keyword",
        ),
        (
            "single-word password after a colon",
            f"The {PASSWORD.capitalize()}: swordfish.",
            "swordfish",
            "Secret Keyword",
        ),
        (
            ".env database password line",
            f"DEBUG=false\nDATABASE_{PASSWORD.upper()}={db_credential}\nPORT=8080",
            db_credential,
            "Secret Keyword",
        ),
        (
            ".env token line the keyword list lacks",
            "GITHUB_TOKEN=" + _random(30),
            _random(30),
            "Environment Secret",
        ),
        (
            "cookie header with a session cookie",
            f"Cookie: session={cookie}; theme=dark",
            cookie,
            "Session Cookie",
        ),
        (
            "set-cookie header with a sid",
            f"Set-Cookie: sid={cookie}; Path=/; Secure; HttpOnly",
            cookie,
            "Session Cookie",
        ),
        (
            "well-known session cookie outside a header",
            f"I logged in and PHPSESSID={cookie} showed up in the log",
            cookie,
            "Session Cookie",
        ),
        (
            "authorization bearer header",
            "Authorization: Bearer " + _random(32),
            _random(32),
            "Authorization Header",
        ),
        ("api key header", "X-API-Key: " + _random(32), _random(32), "Authorization Header"),
        (
            "anthropic key",
            "sk-ant-api03-" + _random(48, _ALNUM + "-_"),
            _random(48, _ALNUM + "-_"),
            "Anthropic API Key",
        ),
        ("google api key", "AIza" + _random(35), "AIza" + _random(35), "Google API Key"),
    ]


SECRET_CASES = _secret_cases()

BENIGN_TEXTS = [
    "I went to the park with my kids on Sunday and we talked about my password manager",
    "Remember to reset your password tomorrow; the old one expires.",
    "My password is something I never share with anyone.",
    "The secret: practice every single day.",
    "The secret to good bread is patience.",
    "Secretary: Jane Doe",
    "the password: see the vault entry",
    "We used a bearer token for auth, and I baked a cookie: chocolate chip.",
    "Set-Cookie: theme=dark; Path=/",
    "550e8400-e29b-41d4-a716-446655440000",
    "sha256:" + "0123456789abcdef" * 4,
    "sha256:df5abcbf1d1091794c1f37efcd89e5f7bd6b91afa631e29f084178d35c55e913",
    "candidate_" + "ab" * 32,
    "scope:" + "0f" * 16,
    "https://example.com/docs/page?q=1#section and http://user@example.com/",
    "2026-08-16T12:34:56.789Z, 2024-01-02 and 1755350096789",
    "D1:3",
    "As said in D12:45 and D3:7, Caroline went to the LGBTQ support group.",
    "event:1755350096789:" + "a-locator-slug-that-is-long-enough-to-look-like-a-token",
    "case-7#correction",
    "purpose:case",
    "version 1.2.3.4 shipped to 203.0.113.7",
    f"{PASSWORD}: ${{DB_{PASSWORD.upper()}}}",
    f"{SECRET}_id: 550e8400-e29b-41d4-a716-446655440000",
    f"{SECRET}: false",
    f"{PASSWORD}_hint=firstpet",
    "AUTH_MODE=password\nTOKEN_TTL=3600",
    base64.b64encode(bytes(range(48))).decode(),
    "0123456789abcdef" * 8,
]


@pytest.fixture(scope="module")
def scanner() -> SecretScanner:
    return SecretScanner()


@pytest.mark.parametrize(
    ("text", "secret", "kind"),
    [case[1:] for case in SECRET_CASES],
    ids=[case[0] for case in SECRET_CASES],
)
def test_each_kind_of_secret_is_found_without_echoing_it(
    scanner: SecretScanner, text: str, secret: str, kind: str
) -> None:
    findings = scanner.scan([text])
    assert kind in [finding.kind for finding in findings]
    assert secret not in repr(findings)
    assert all(secret not in str(finding) for finding in findings)


@pytest.mark.parametrize("text", BENIGN_TEXTS)
def test_ordinary_text_ids_digests_dates_and_urls_are_not_flagged(
    scanner: SecretScanner, text: str
) -> None:
    assert scanner.scan([text]) == []


def test_a_finding_holds_nothing_but_the_detector_kind() -> None:
    assert [field.name for field in dataclasses.fields(SecretFinding)] == ["kind"]
    finding = SecretFinding("AWS Access Key")
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.kind = "other"  # type: ignore[misc]
    assert repr(finding) == "SecretFinding(kind='AWS Access Key')"


def test_findings_follow_text_order_and_each_kind_appears_once(scanner: SecretScanner) -> None:
    jwt, akia = _jwt(), "AKIA" + "Q" * 16
    findings = scanner.scan(["nothing here", jwt, akia, "again " + jwt])
    assert findings == [SecretFinding("JSON Web Token"), SecretFinding("AWS Access Key")]


def test_first_stops_at_the_first_finding_and_is_none_for_clean_text(
    scanner: SecretScanner,
) -> None:
    texts = ["clean", "AKIA" + "Q" * 16, _jwt()]
    assert scanner.first(texts) == scanner.scan(texts)[0]
    assert scanner.first(BENIGN_TEXTS) is None
    assert scanner.first([]) is None


def _cpu_seconds(scanner: SecretScanner, text: str) -> float:
    """The least process CPU time of three scans (CPU time, and the least, to damp the noise of
    a shared machine; the absolute cost is measured by ``python -m bench.secrets``)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        scanner.scan([text])
        best = min(best, time.process_time() - started)
    return best


def _assert_scan_cost_grows_linearly(scanner: SecretScanner, unit: str) -> None:
    # Quadrupling the text quadruples a linear scan's cost and multiplies a quadratic one by 16.
    small = (unit * (16384 // len(unit) + 1))[:16384]
    large = (unit * (65536 // len(unit) + 1))[:65536]
    assert _cpu_seconds(scanner, large) < 8 * _cpu_seconds(scanner, small) + 0.05


def test_a_64_kib_ordinary_text_is_clean_and_scanned_in_linear_time(
    scanner: SecretScanner,
) -> None:
    line = "On Sunday D1:3 we met at 2026-08-16T12:34:56.789Z; digest sha256:" + "ab" * 32 + "\n"
    text = (line * (65536 // len(line) + 1))[:65536]
    assert scanner.scan([text]) == []
    _assert_scan_cost_grows_linearly(scanner, line)


@pytest.mark.parametrize(
    "unit",
    [
        "/",
        "eyJ",
        "eyJa.",
        "sk-",
        "sk-T3BlbkFJ",
        "//a/:_authToken=/",
        "password: a b ",
        "x",
        "-",
        "A ",
        "ab-",
        "key=",
        "aGVsbG8gd29ybGQh",
    ],
)
def test_texts_built_to_make_patterns_backtrack_scan_in_linear_time(
    scanner: SecretScanner, unit: str
) -> None:
    _assert_scan_cost_grows_linearly(scanner, unit)


def test_one_scanner_can_be_shared_between_threads(scanner: SecretScanner) -> None:
    texts = [case[1] for case in SECRET_CASES] + BENIGN_TEXTS
    expected = [scanner.scan([text]) for text in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda text: scanner.scan([text]), texts * 4))
    assert results == expected * 4


def test_scanning_leaves_detect_secrets_global_settings_untouched(scanner: SecretScanner) -> None:
    before = get_settings().json()
    scanner.scan([case[1] for case in SECRET_CASES])
    assert get_settings().json() == before


def test_the_fingerprint_names_the_library_version_and_our_rules(scanner: SecretScanner) -> None:
    assert scanner.fingerprint.startswith("detect-secrets==")
    assert "KeywordDetector" in scanner.fingerprint
    assert "HighEntropy" not in scanner.fingerprint
    assert scanner.fingerprint == SecretScanner().fingerprint
    assert "Secret Keyword" in scanner.kinds


# --------------------------------------------------------------------------------------------
# Obfuscated presentations (issue 13, item 4): each form the gate used to miss, as a table
# --------------------------------------------------------------------------------------------

_BASE32 = string.ascii_uppercase + "234567"


def _aws_key_id() -> str:
    return "AKIA" + _random(16, _BASE32, seed=13)


def _github_token() -> str:
    return "gh" + "p_" + _random(36, seed=14)


def _spaced(token: str) -> str:
    return " ".join(token)


def _hyphenated(token: str) -> str:
    return "-".join(token[i : i + 4] for i in range(0, len(token), 4))


def _zero_width_joined(token: str) -> str:
    return "\u200b".join(token)


def _fullwidth(token: str) -> str:
    return "".join(chr(ord(char) + 0xFEE0) for char in token)


def _split(token: str) -> str:
    return token[: len(token) // 2] + "\n" + token[len(token) // 2 :]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _obfuscated_cases() -> list[tuple[str, str]]:
    akia, ghp, jwt = _aws_key_id(), _github_token(), _jwt()
    pem_lower = _pem(_kw("RSA PRIVATE", " KEY")).replace("BEGIN", "begin").replace("RSA", "rsa")
    pem_lower = pem_lower.replace("PRIVATE KEY", "private key")
    dot = jwt.index(".")
    return [
        ("aws key id lower-cased", f"the key is {akia.lower()} ok"),
        ("aws key id spaced", f"key: {_spaced(akia)}"),
        ("aws key id hyphenated", f"key {_hyphenated(akia)} here"),
        ("aws key id zero-width joined", f"key {_zero_width_joined(akia)}"),
        ("aws key id base64 encoded", _b64(f"deploy with {akia} today")),
        ("aws key id split across lines", f"key:\n{_split(akia)}\nend"),
        ("aws key id in full-width characters", f"key {_fullwidth(akia)}"),
        ("bare 40-character aws secret key", _aws_secret_key()),
        ("github token spaced", f"token {_spaced(ghp)}"),
        ("github token reversed", f"token {ghp[::-1]}"),
        ("github token zero-width joined", _zero_width_joined(ghp)),
        ("pem block with a lower-case header", pem_lower),
        ("jwt split over two lines", f"{jwt[: dot + 1]}\n{jwt[dot + 1 :]}"),
        (
            "password stated in prose",
            f"my gmail {PASSWORD} is Kestrel{_random(2, string.digits)}!gEx",
        ),
        ("password in prose, portuguese", f"minha senha do banco é Velvet{_random(3)}#9"),
        (
            "password after 'for the ... is'",
            f"the {PASSWORD} for the router is Quasar7{_random(4)}!",
        ),
        (
            "password attribute in a .net config",
            f'<add key="Smtp{PASSWORD}" value="S3cr{_random(6)}" />',
        ),
        ("hex-encoded sentence with a key", f"deploy with {akia} today".encode().hex()),
    ]


OBFUSCATED_CASES = _obfuscated_cases()


@pytest.mark.parametrize(
    "text", [case[1] for case in OBFUSCATED_CASES], ids=[case[0] for case in OBFUSCATED_CASES]
)
def test_obfuscated_secrets_are_found_without_echoing_them(
    scanner: SecretScanner, text: str
) -> None:
    findings = scanner.scan([text])
    assert findings
    assert scanner.first([text]) == findings[0]
    assert all(finding.kind in scanner.kinds for finding in findings)
    shown = repr(findings)
    assert _aws_key_id() not in shown and _github_token() not in shown and text not in shown


LOOK_ALIKES = [
    "sha1 of the file is " + _random(40, "0123456789abcdef"),
    "fixed in commit " + _random(40, "0123456789abcdef", seed=3) + " on main",
    _random(40, "0123456789abcdef", seed=4).upper(),
    " ".join(_random(7, "0123456789abcdef", seed=n) for n in range(6)),
    "request 3f2b9c1e-8d4a-4b6f-9e2d-7a1c5b3e9f00 failed",
    "The AWS docs use AKIA" + "IOSFODNN7" + "EXAMPLE as a sample key id.",
    "e.g. the example secret wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY",
    _b64("I went to the park with my kids on Sunday and we talked about school."),
    b"I went to the park with my kids on Sunday".hex(),
    "upgraded to 2.0.0-rc.1+build.5 and node v22.11.0",
    "Slovakia and Wallachia were on the itinerary.",
    "my " + PASSWORD + " is incorrect, so the login failed twice",
    "the " + PASSWORD + " is in the vault under 'bank'",
    PASSWORD.capitalize() + "s must be at least 12 characters long.",
    "the new " + PASSWORD + " policy: min-length 12, one digit",
    PASSWORD + " reset link: https://example.com/r?x=1",
    "run pwd to print the directory",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + _random(43, _ALNUM + "+/") + " ana@laptop",
    _pem("PUBLIC KEY"),
    "getUserAccountSettingsForTenantById2024x is the handler name",
    "N A S A and the U S A",
    "emoji family 👨\u200d👩\u200d👧 and the word café",
    "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ １２３",
    "Dear Ana,\nthanks for the\nlovely dinner.\nBest, Bo",
]


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alikes_of_secrets_are_not_flagged(scanner: SecretScanner, text: str) -> None:
    assert scanner.scan([text]) == []


def test_documented_placeholders_are_recognised_by_their_marker_only(
    scanner: SecretScanner,
) -> None:
    placeholder = "AKIA" + "IOSFODNN7" + "EXAMPLE"
    assert scanner.scan([f"sample key {placeholder}"]) == []
    # A real key written next to the marker is still a key: only the matched key is examined.
    assert scanner.scan([f"sample key {_aws_key_id()} EXAMPLE"]) != []


def _count_examinations(scanner: SecretScanner, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ``scanner`` examines from now on, in order (a text once per examination)."""
    examined: list[str] = []
    real = scanner._examinations

    def counting(text: str):  # type: ignore[no-untyped-def]
        examined.append(text)
        return real(text)

    monkeypatch.setattr(scanner, "_examinations", counting)
    return examined


def test_a_text_repeated_in_a_candidate_is_examined_once(monkeypatch: pytest.MonkeyPatch) -> None:
    scanner = SecretScanner()
    examined = _count_examinations(scanner, monkeypatch)
    texts = ["citation:turn", "component:turn", "citation:turn", "citation:turn"]
    assert scanner.first(texts) is None
    assert scanner.scan(texts) == []
    assert examined == ["citation:turn", "component:turn"] * 2
    key = "AKIA" + _random(16, string.ascii_uppercase + string.digits)
    # The first finding is still the first text's: a repeat neither adds nor moves one.
    assert scanner.first(["ok", key, "ok", key]) == SecretFinding("AWS Access Key")
    assert scanner.scan(["ok", key, "ok", key]) == [SecretFinding("AWS Access Key")]


def test_a_remembered_answer_is_the_answer_a_scan_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """``first`` remembers each text's answer: asked again (in any mix of texts), it answers
    exactly as a scanner that never saw the text, without examining the text again."""
    remembering = SecretScanner()
    examined = _count_examinations(remembering, monkeypatch)
    texts = [case[1] for case in SECRET_CASES] + list(BENIGN_TEXTS)
    for text in texts:
        assert remembering.first([text], "t\x1fw") == SecretScanner().first([text])
    scanned = len(examined)
    assert scanned == len(set(texts))
    mixes = [texts[i : i + 3] for i in range(0, len(texts), 2)] + [list(BENIGN_TEXTS)]
    for mix in mixes:
        assert remembering.first(mix, "t\x1fw") == SecretScanner().first(mix)
    assert len(examined) == scanned  # every answer came from the memo


def test_the_memo_is_kept_per_partition_and_holds_no_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scanner = SecretScanner()
    examined = _count_examinations(scanner, monkeypatch)
    key = "AKIA" + _random(16, string.ascii_uppercase + string.digits)
    text = f"the deploy key is {key}"
    for partition in ("tenant-a\x1fws", "tenant-b\x1fws", "tenant-a\x1fws"):
        assert scanner.first([text], partition) == SecretFinding("AWS Access Key")
    # Another workspace's scan of a text does not answer for this one (no timing to learn from).
    assert examined == [text, text]
    memo = scanner._memo
    assert sorted(memo.values()) == ["AWS Access Key"] * 2
    stored = b"".join(memo) + "".join(memo.values()).encode()
    assert key.encode() not in stored and b"deploy" not in stored
    assert all(len(digest) == 16 for digest in memo)


def test_the_memo_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from engram_memory.policy import secrets as secrets_module

    monkeypatch.setattr(secrets_module, "_MEMO_ENTRIES", 4)
    scanner = SecretScanner()
    for index in range(10):
        assert scanner.first([f"an ordinary note number {index}"]) is None
        assert len(scanner._memo) <= 4
