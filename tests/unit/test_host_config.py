"""The host configuration: CONTRACT §12 defaults, a closed host.json, private atomic writes."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from engram_memory.binding.host_config import AdmissionConfig, HostConfig, RetentionConfig
from engram_memory.embedded.data_dir import host_config_path
from engram_memory.embedded.errors import HostConfigError
from engram_memory.embedded.host_file import load_host_config, save_host_config
from engram_memory.engine.context import RetentionPolicy, Scope
from engram_memory.engine.ports import AdmissionRequest


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write(data_dir: Path, content: Any) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = host_config_path(data_dir)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_missing_host_json_gives_the_embedded_defaults_of_the_contract(tmp_path: Path) -> None:
    config = load_host_config(tmp_path / "nowhere")
    assert config == HostConfig()
    assert config.resource == "http://127.0.0.1:8765/mcp"
    assert config.issuer == "engram-memory-local" and config.tenant_id == "local"
    assert config.allowed_origins == ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    assert config.admission.mode == "auto" and config.admission.host_rules == []
    assert config.retention_policy() == RetentionPolicy(
        allow_retain=False, max_expires_in_s=31_536_000
    )
    assert config.reconcile_consent is False and config.default_token_ttl_s == 86_400
    assert not (tmp_path / "nowhere").exists()  # reading never creates anything


def test_a_saved_configuration_loads_back_equal_from_a_private_file(tmp_path: Path) -> None:
    config = HostConfig(
        resource="https://memory.example/mcp",
        tenant_id="tenant-acme",
        admission=AdmissionConfig(
            mode="manual",
            host_rules=[{"kind": "max_text_bytes", "name": "short", "limit": 2000}],
        ),
        retention=RetentionConfig(allow_retain=True, max_expires_in_s=3600),
        reconcile_consent=True,
    )
    path = save_host_config(tmp_path / "data", config)
    assert path == tmp_path / "data" / "host.json"
    assert load_host_config(tmp_path / "data") == config
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["host.json"]  # no temporary file left
    save_host_config(tmp_path / "data", HostConfig())  # replaces atomically
    assert load_host_config(tmp_path / "data") == HostConfig()


def test_an_embedding_model_is_a_directory_and_the_digest_of_its_model(tmp_path: Path) -> None:
    model = {"path": "models/e5", "sha256": "0123456789abcdef" * 4}
    _write(tmp_path, {"search": {"semantic": "local", "embedding_model": model}})
    config = load_host_config(tmp_path)
    assert config.search.embedding_model is not None
    assert config.search.embedding_model.model_dump() == model
    assert HostConfig().search.embedding_model is None  # the shipped MiniLM by default


def test_a_partial_host_json_fills_in_the_defaults(tmp_path: Path) -> None:
    _write(tmp_path, {"admission": {"mode": "manual"}})
    config = load_host_config(tmp_path)
    assert config.admission.mode == "manual" and config.resource == HostConfig().resource


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON (line 1"),
        ("[1, 2]", "must hold a JSON object"),
        ({"admission": {"mode": "yolo"}}, "admission.mode"),
        ({"resourse": "http://x/mcp"}, "resourse: Extra inputs are not permitted"),
        ({"resource": "ftp://x/mcp"}, "resource: the resource must be an absolute http(s) URL"),
        ({"resource": "http://x/mcp#frag"}, "resource"),
        ({"resource": "/mcp"}, "resource"),
        ({"tenant_id": ""}, "tenant_id"),
        ({"tenant_id": " local"}, "tenant_id"),
        ({"allowed_origins": ["*"]}, "allowed_origins"),
        ({"allowed_origins": ["http://localhost:*/path"]}, "allowed_origins"),
        ({"retention": {"allow_retain": "yes"}}, "retention.allow_retain"),
        ({"retention": {"max_expires_in_s": 0}}, "retention.max_expires_in_s"),
        ({"reconcile_consent": 1}, "reconcile_consent"),
        ({"default_token_ttl_s": "60"}, "default_token_ttl_s"),
        (
            {"admission": {"host_rules": [{"kind": "deny_pattern", "name": "x", "pattern": "("}]}},
            "admission.host_rules",
        ),
        (
            {"admission": {"host_rules": [{"kind": "teleport", "name": "x"}]}},
            "admission.host_rules",
        ),
        (
            {"search": {"semantic": "local", "embedding_model": {"path": "m", "sha256": "ab"}}},
            "search.embedding_model.sha256",
        ),
        (
            {
                "search": {
                    "semantic": "local",
                    "embedding_model": {"path": "m", "sha256": "a" * 64, "url": "https://x"},
                }
            },
            "search.embedding_model.url: Extra inputs are not permitted",
        ),
        (
            {"search": {"embedding_model": {"path": "m", "sha256": "a" * 64}}},
            'embedding_model needs "semantic": "local"',
        ),
    ],
)
def test_an_invalid_host_json_is_reported_for_a_person(
    tmp_path: Path, content: Any, expected: str
) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(HostConfigError) as raised:
        load_host_config(tmp_path)
    message = str(raised.value)
    assert str(path) in message and expected in message
    assert "\n" not in message and "errors.pydantic.dev" not in message


def test_an_unreadable_host_json_is_a_host_config_error(tmp_path: Path) -> None:
    host_config_path(tmp_path).mkdir()  # a directory where the file should be
    with pytest.raises(HostConfigError, match="cannot read"):
        load_host_config(tmp_path)


def test_the_configuration_is_immutable() -> None:
    config = HostConfig()
    with pytest.raises(ValidationError):
        config.tenant_id = "other"  # type: ignore[misc]


def _request(text: str) -> AdmissionRequest:
    return AdmissionRequest(
        scope=Scope("local", "default"),
        principal="p",
        candidate_id="c",
        record={"components": [{"text": text}], "citations": []},
        evidence={},
        host_facts=(),
    )


def test_the_admission_policy_follows_the_configuration() -> None:
    auto = HostConfig().admission_policy()
    assert auto.mode == "auto" and auto.host_rules == ()
    assert auto.decide(_request("a plain note about the build")).decision == "accept"
    manual = HostConfig(
        admission=AdmissionConfig(
            mode="manual",
            host_rules=[{"kind": "deny_pattern", "name": "no-pii", "pattern": "(?i)passport"}],
        )
    ).admission_policy()
    assert manual.mode == "manual" and [rule.name for rule in manual.host_rules] == ["no-pii"]
    assert (
        manual.decide(_request("a plain note about the build")).decision == "adjudication_required"
    )
    assert manual.decide(_request("my Passport number")).rule == "host:no-pii"
    assert manual.version() != auto.version()


def test_the_quality_gate_follows_the_configuration() -> None:
    """Defaults: near-duplicates held, low information under 12 letters and digits rejected;
    host.json can reject near-duplicates instead, or turn either check off."""
    from engram_memory.engine.ports import Neighbour
    from engram_memory.policy import quality

    default = AdmissionConfig()
    assert default.near_duplicate_threshold == quality.DEFAULT_NEAR_DUPLICATE_THRESHOLD
    assert default.min_text_chars == quality.DEFAULT_MIN_TEXT_CHARS
    text = "The build server runs the nightly job at 02:00 UTC."
    near = replace(_request(text.upper() + "!"), neighbours=(Neighbour("mem_abc", text),))
    held = HostConfig().admission_policy().decide(near)
    assert (held.decision, held.rule, held.resembles) == (
        "adjudication_required",
        "near-duplicate",
        ("mem_abc",),
    )
    strict = HostConfig(admission=AdmissionConfig(near_duplicates="rejected")).admission_policy()
    assert strict.decide(near).decision == "reject"
    lax = HostConfig(
        admission=AdmissionConfig(near_duplicates="off", min_text_chars=0)
    ).admission_policy()
    assert lax.decide(near).decision == "accept"
    assert lax.decide(_request("ok")).decision == "accept"
    assert HostConfig().admission_policy().decide(_request("ok!!")).rule == "low-information"
    assert len({strict.version(), lax.version(), HostConfig().admission_policy().version()}) == 3


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://127.0.0.1:6274", True),
        ("http://localhost:5173", True),
        ("http://LOCALHOST:5173", True),
        ("http://localhost", True),
        ("http://[::1]:3000", True),
        ("https://localhost:5173", False),
        ("http://evil.example", False),
        ("http://127.0.0.1.evil.example:80", False),
        ("http://localhost.evil.example", False),
        ("null", False),
        ("", False),
        ("http://localhost:*", False),
    ],
)
def test_browser_origins_are_matched_against_the_allowed_patterns(
    origin: str, allowed: bool
) -> None:
    assert HostConfig().origin_allowed(origin) is allowed


def test_an_exact_origin_pattern_matches_only_its_port() -> None:
    config = HostConfig(allowed_origins=["https://app.example", "http://tool.example:8080"])
    assert config.origin_allowed("https://app.example")
    assert config.origin_allowed("https://app.example:443")
    assert not config.origin_allowed("https://app.example:8443")
    assert config.origin_allowed("http://tool.example:8080")
    assert not config.origin_allowed("http://tool.example")
