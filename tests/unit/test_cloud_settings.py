"""Each cloud function kind's settings: one pydantic model, one line per bad variable."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engram_memory.adapters.aws.client_config import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    client_config,
)
from engram_memory.cloud.settings import (
    AdapterSettings,
    ApprovalSettings,
    ConfigurationError,
    DrainerSettings,
    ForgetGateSettings,
    HostBinding,
    ToolFunctionSettings,
    WithdrawGateSettings,
    WorkflowSettings,
)

ENGINE_ENV = {
    "AWS_REGION": "eu-west-1",
    "ENGRAM_TENANT_ID": "acme",
    "ENGRAM_TABLE": "engram-acme",
    "ENGRAM_BLOB_BUCKET": "engram-acme-bodies",
    "ENGRAM_KEY_TABLE": "engram-acme-keys",
    "ENGRAM_DATA_KEY_ARN": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    "ENGRAM_CURSOR_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:cursor",
    "ENGRAM_OPENSEARCH_ENDPOINT": "https://search-acme.eu-west-1.es.amazonaws.com",
}
INVOCATION_KEY = {
    "ENGRAM_INVOCATION_KEY_ARN": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-0000000000aa"
}
PROOF_KEY = {
    "ENGRAM_APPROVAL_PROOF_KEY_ARN": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-0000000000bb"
}
TOOL_ENV = {**ENGINE_ENV, **INVOCATION_KEY}
WORKFLOW_ENV = {**TOOL_ENV, **PROOF_KEY}
GATE_ENV = {
    "AWS_REGION": "eu-west-1",
    "ENGRAM_TABLE": "engram-acme",
    "ENGRAM_APPROVAL_BASE_URL": "https://memory.acme.example",
    "ENGRAM_WITHDRAW_STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:123456789012:stateMachine:w",
    "ENGRAM_FORGET_STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:123456789012:stateMachine:f",
}
ADAPTER_ENV = {
    "AWS_REGION": "eu-west-1",
    "ENGRAM_TENANT_ID": "acme",
    "ENGRAM_TOOL_FUNCTIONS": json.dumps({"search": "engram-acme-search", "get": "engram-acme-get"}),
    "ENGRAM_RESOURCE_URI": "https://memory.acme.example/mcp",
    "ENGRAM_ISSUER": "https://login.acme.example/realms/agents",
    "ENGRAM_REQUEST_STATE_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rs",
    "ENGRAM_ALLOWED_ORIGINS": "https://app.acme.example, https://ops.acme.example",
    "ENGRAM_ALLOWED_HOSTS": "",  # blank: unset
    **INVOCATION_KEY,
}
APPROVAL_ENV = {
    "AWS_REGION": "eu-west-1",
    "ENGRAM_TABLE": "engram-acme",
    "ENGRAM_BLOB_BUCKET": "engram-acme-bodies",
    "ENGRAM_KEY_TABLE": "engram-acme-keys",
    "ENGRAM_DATA_KEY_ARN": ENGINE_ENV["ENGRAM_DATA_KEY_ARN"],
    "ENGRAM_ISSUER": "https://issuer.acme.example",
    "ENGRAM_APPROVAL_AUDIENCE": "engram-approvals",
    "ENGRAM_RESOURCE_URI": "https://memory.acme.example/mcp",
    "ENGRAM_APPROVAL_BASE_URL": "https://memory.acme.example",
    "ENGRAM_APPROVAL_SESSION_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:s",
    **PROOF_KEY,
}

# model, a complete environment, its required variables
KINDS: list[tuple[Any, dict[str, str], list[str]]] = [
    (ToolFunctionSettings, TOOL_ENV, [n for n in TOOL_ENV if n != "AWS_REGION"]),
    (WorkflowSettings, WORKFLOW_ENV, [n for n in WORKFLOW_ENV if n != "AWS_REGION"]),
    (DrainerSettings, ENGINE_ENV, [n for n in ENGINE_ENV if n != "AWS_REGION"]),
    (
        WithdrawGateSettings,
        GATE_ENV,
        ["ENGRAM_TABLE", "ENGRAM_APPROVAL_BASE_URL", "ENGRAM_WITHDRAW_STATE_MACHINE_ARN"],
    ),
    (
        ForgetGateSettings,
        GATE_ENV,
        ["ENGRAM_TABLE", "ENGRAM_APPROVAL_BASE_URL", "ENGRAM_FORGET_STATE_MACHINE_ARN"],
    ),
    (
        AdapterSettings,
        ADAPTER_ENV,
        [
            "ENGRAM_TENANT_ID",
            "ENGRAM_TOOL_FUNCTIONS",
            "ENGRAM_RESOURCE_URI",
            "ENGRAM_ISSUER",
            "ENGRAM_REQUEST_STATE_SECRET_ARN",
            "ENGRAM_INVOCATION_KEY_ARN",
        ],
    ),
    (ApprovalSettings, APPROVAL_ENV, [n for n in APPROVAL_ENV if n != "AWS_REGION"]),
]
MISSING = [
    pytest.param(model, env, name, id=f"{model.__name__}-{name}")
    for model, env, required in KINDS
    for name in required
]


@pytest.mark.parametrize(("model", "env", "required"), KINDS, ids=[k[0].__name__ for k in KINDS])
def test_a_complete_environment_parses(
    model: Any, env: dict[str, str], required: list[str]
) -> None:
    settings = model.from_env(env)
    assert settings.region == "eu-west-1"


@pytest.mark.parametrize(("model", "env", "name"), MISSING)
def test_a_missing_variable_is_one_line_naming_it_and_what_to_set(
    model: Any, env: dict[str, str], name: str
) -> None:
    for absent in ({k: v for k, v in env.items() if k != name}, {**env, name: "  "}):
        with pytest.raises(ConfigurationError) as raised:
            model.from_env(absent)
        message = str(raised.value)
        assert message.startswith(f"{name} is not set: set it to "), message
        assert "\n" not in message


@pytest.mark.parametrize(
    ("model", "env", "name", "value"),
    [
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_ADMISSION_MODE", "lenient"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_DATA_KEY_ARN", "alias/engram"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_OPENSEARCH_ENDPOINT", "http://plain.example"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_OPENSEARCH_SERVICE", "solr"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_OPENSEARCH_INDEX", "Engram"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_OPENSEARCH_REPLICAS", "3"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_SEMANTIC", "remote"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_FUSION", "max"),
        (ToolFunctionSettings, TOOL_ENV, "ENGRAM_EMBEDDING_MODEL_SHA256", "ABC"),
        (DrainerSettings, ENGINE_ENV, "ENGRAM_RETENTION_CEILING_S", "-5"),
        (WorkflowSettings, WORKFLOW_ENV, "ENGRAM_RETENTION_CEILING_S", "a week"),
        (ForgetGateSettings, GATE_ENV, "ENGRAM_APPROVAL_BASE_URL", "http://memory.acme.example"),
        (AdapterSettings, ADAPTER_ENV, "ENGRAM_TOOL_FUNCTIONS", "search=engram-acme-search"),
        (AdapterSettings, ADAPTER_ENV, "ENGRAM_TOOL_FUNCTIONS", '{"delete": "engram-acme-x"}'),
    ],
)
def test_an_invalid_variable_is_one_line_naming_it(
    model: Any, env: dict[str, str], name: str, value: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        model.from_env({**env, name: value})
    message = str(raised.value)
    assert message.startswith(f"{name} is invalid: set it to "), message
    assert "\n" not in message


def test_the_engine_settings_parse_their_values_and_defaults() -> None:
    settings = ToolFunctionSettings.from_env({**TOOL_ENV, "ENGRAM_RETENTION_CEILING_S": "3600"})
    assert settings.binding() == HostBinding("acme", 3600)
    assert (settings.admission_mode, settings.fusion, settings.semantic) == (
        "auto",
        "minmax",
        "off",
    )
    assert (settings.opensearch_index, settings.opensearch_service) == ("engram-records", "es")
    assert settings.opensearch_replicas is None  # the domain's default, unless the stack says
    per_tenant = {
        "ENGRAM_OPENSEARCH_INDEX": "engram-acme-records",
        "ENGRAM_OPENSEARCH_REPLICAS": "0",
    }
    parsed = ToolFunctionSettings.from_env({**TOOL_ENV, **per_tenant})
    assert (parsed.opensearch_index, parsed.opensearch_replicas) == ("engram-acme-records", 0)
    assert ToolFunctionSettings.from_env(TOOL_ENV).binding() == HostBinding("acme")


def test_the_adapter_settings_parse_lists_and_the_tool_map() -> None:
    settings = AdapterSettings.from_env(ADAPTER_ENV)
    assert settings.tool_functions == {"search": "engram-acme-search", "get": "engram-acme-get"}
    assert settings.allowed_origins == ["https://app.acme.example", "https://ops.acme.example"]
    assert settings.allowed_hosts == [] and settings.retention_ceiling_s is None


def test_a_region_is_needed_only_to_build_a_client() -> None:
    settings = ApprovalSettings.from_env(
        {k: v for k, v in APPROVAL_ENV.items() if k != "AWS_REGION"}
    )
    with pytest.raises(ConfigurationError, match=r"^AWS_REGION is not set"):
        settings.session()
    assert ApprovalSettings.from_env({**APPROVAL_ENV}).session().region_name == "eu-west-1"


def test_every_client_shares_one_policy_and_the_adapter_s_lambda_client_only_waits_longer() -> None:
    config = client_config()
    # botocore sets the options as attributes its stubs do not declare
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)  # type: ignore[attr-defined]
    assert config.retries == {"mode": "standard", "max_attempts": 3}  # type: ignore[attr-defined]
    slow = client_config(read_timeout_s=28, retries=False)
    assert (slow.connect_timeout, slow.read_timeout) == (CONNECT_TIMEOUT_S, 28)  # type: ignore[attr-defined]
    assert slow.retries == {"mode": "standard", "max_attempts": 1}  # type: ignore[attr-defined]


def test_the_adapter_s_host_configuration_names_the_variable_it_refuses() -> None:
    from engram_memory.cloud.composition import build_adapter

    settings = AdapterSettings.from_env({**ADAPTER_ENV, "ENGRAM_RESOURCE_URI": "memory.example"})
    with pytest.raises(ConfigurationError) as raised:
        build_adapter(settings, jwks={"keys": []})
    assert str(raised.value).startswith("ENGRAM_RESOURCE_URI is invalid: "), raised.value
    with pytest.raises(ConfigurationError) as raised:  # the issuer's keys are unusable
        build_adapter(AdapterSettings.from_env(ADAPTER_ENV), jwks={"keys": []})
    assert str(raised.value).startswith("ENGRAM_ISSUER is invalid: "), raised.value


def test_the_adapter_s_audience_aliases_reach_its_token_verifier() -> None:
    """Entra ID v2 and Cognito write a client id as ``aud``: ENGRAM_AUDIENCE_ALIASES names it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from engram_memory.binding.tokens import public_jwks
    from engram_memory.cloud.mcp_adapter import host_config_of, token_verifier

    env = {**ADAPTER_ENV, "ENGRAM_AUDIENCE_ALIASES": " 6e1c3f52-8a4b-4c8e-9d5f-2b7a1c9e4d30 ,"}
    settings = AdapterSettings.from_env(env)
    assert settings.audience_aliases == ["6e1c3f52-8a4b-4c8e-9d5f-2b7a1c9e4d30"]
    assert AdapterSettings.from_env(ADAPTER_ENV).audience_aliases == []  # unset: none
    jwks = public_jwks(Ed25519PrivateKey.generate(), "kid-1")
    verifier = token_verifier(host_config_of(settings), jwks, None, settings.audience_aliases)
    assert verifier.audience == settings.resource_uri
    assert verifier.audience_aliases == ("6e1c3f52-8a4b-4c8e-9d5f-2b7a1c9e4d30",)
