"""Test support shared by every tier: fakes, argument builders and the engine harness.

Fakes over mocks: the clock, the confirmation workflow and a scripted admission policy are small
real implementations of their ports; faults are injected through the adapters' own seams.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import aws_encryption_sdk
import pytest
from aws_cryptographic_material_providers.mpl import AwsCryptographicMaterialProviders
from aws_cryptographic_material_providers.mpl.config import MaterialProvidersConfig
from aws_cryptographic_material_providers.mpl.models import AesWrappingAlg, CreateRawAesKeyringInput

from engram_memory.adapters.local.audit import MemoryAuditLog
from engram_memory.adapters.local.sqlite.indexes import SqliteLexicalIndex, SqliteVectorIndex
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.adapters.local.vault import LocalVault
from engram_memory.contract.packing import unpack_all
from engram_memory.embedded.in_process import call_in_process
from engram_memory.engine import lexical
from engram_memory.engine.context import TOOLS, Scope, TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationNeeded, ConfirmationRequest
from engram_memory.engine.ports import (
    AdmissionRequest,
    EmbedderUnavailable,
    PolicyDecision,
    PolicyUnavailable,
)
from engram_memory.engine.service import Engine, EngineSettings, new_audit_id

if TYPE_CHECKING:
    import uvicorn

TENANT = "tenant-acme-0001"
WORKSPACE = "ws-research-0001"
OTHER_WORKSPACE = "ws-finance-0002"
PRINCIPAL = "agent-alice"
PURPOSE = "purpose:general"
START_MS = 1_780_000_000_000  # 2026-05-28, a fixed "now" for deterministic tests


def scanned_bytes(path: Path) -> bytes:
    """What a byte scan for leftover text must search in a file: its bytes, and the documents the
    store keeps packed (deflated, ``contract.packing``) unpacked and a gzip'd audit segment
    decompressed, so compression never hides a text the scan is looking for."""
    raw = path.read_bytes()
    if path.suffix == ".gz":  # a sealed audit segment
        raw = gzip.decompress(raw)
    return b"\n".join([raw, *unpack_all(raw)])


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class FakeClock:
    def __init__(self, now_ms: int = START_MS) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class ScriptedConfirmations:
    """A scripted human who approves, declines, or hands back a doctored approval.

    ``obtain`` is what the in-process transport asks (``in_process.call_in_process``); in
    ``no_channel`` mode there is nobody to ask (``channel`` is ``None``).
    """

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.mode = "approve"  # approve | decline | no_channel
        self.requests: list[ConfirmationRequest] = []
        self.fixed: Approval | None = None  # hand back this approval every time (reuse)
        self.doctor: Callable[[Approval], Approval] | None = None
        self.last: Approval | None = None

    @property
    def channel(self) -> Callable[[ConfirmationRequest], Approval | None] | None:
        return None if self.mode == "no_channel" else self.obtain

    def obtain(self, request: ConfirmationRequest) -> Approval | None:
        self.requests.append(request)
        if self.mode == "decline":
            return None
        if self.fixed is not None:
            return self.fixed
        now_ms = self.clock.now_ms()
        approval = Approval.fresh(request, issued_at_ms=now_ms, approved_at_ms=now_ms)
        if self.doctor is not None:
            approval = self.doctor(approval)
        self.last = approval
        return approval


class ScriptedPolicy:
    """An admission policy that answers what the test says."""

    policy_id = "scripted-policy"

    def __init__(self, decision: str = "accept") -> None:
        self.decision = decision
        self.version_value = "v1"
        self.unavailable = False
        self.move_version_during_decide = False
        self.seen: list[AdmissionRequest] = []

    def version(self) -> str:
        if self.unavailable:
            raise PolicyUnavailable("down")
        return self.version_value

    def decide(self, request: AdmissionRequest) -> PolicyDecision:
        self.seen.append(request)
        if self.unavailable:
            raise PolicyUnavailable("down")
        if self.move_version_during_decide:
            self.version_value += "+"
        return PolicyDecision(self.decision, "scripted")  # type: ignore[arg-type]


class HashingEmbedder:
    """A deterministic fake embedder: the analyzed terms hashed into 64 signed buckets, unit length.

    Texts that share terms are close, texts that share none are orthogonal (up to collisions);
    ``synonyms`` maps a term to another so a test can make two texts similar without a shared
    word. ``unavailable = True`` makes ``embed`` raise ``EmbedderUnavailable``.
    """

    model_id = "test-hashing-embedder/64"
    dimensions = 64

    def __init__(self, synonyms: dict[str, str] | None = None) -> None:
        self.synonyms = synonyms or {}
        self.unavailable = False
        self.calls = 0

    def embed(self, texts: Any) -> list[tuple[float, ...]]:
        if self.unavailable:
            raise EmbedderUnavailable("the fake embedder is down")
        self.calls += 1
        vectors = []
        for text in texts:
            vector = [0.0] * self.dimensions
            for term in lexical.analyze(text):
                term = self.synonyms.get(term, term)
                h = hashlib.sha256(term.encode()).digest()
                vector[h[0] % self.dimensions] += 1.0 if h[1] % 2 else -1.0
            norm = sum(x * x for x in vector) ** 0.5 or 1.0
            vectors.append(tuple(x / norm for x in vector))
        return vectors


def context(
    *,
    principal: str = PRINCIPAL,
    workspace: str = WORKSPACE,
    tenant: str = TENANT,
    purpose: str = PURPOSE,
    **overrides: Any,
) -> TrustedContext:
    base = TrustedContext(
        audit_id=new_audit_id(),
        tenant_id=tenant,
        workspace_id=workspace,
        principal=principal,
        purpose_ref=purpose,
        grants=frozenset(TOOLS),  # and the default retention policy
    )
    return replace(base, **overrides)


def object_paths(node: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """The path (keys and list indexes) to every JSON object in ``node``, itself included."""
    found: list[tuple[str | int, ...]] = []
    if isinstance(node, dict):
        found.append(path)
        for name, child in node.items():
            found.extend(object_paths(child, (*path, name)))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found.extend(object_paths(child, (*path, index)))
    return found


DELETE = object()  # ``with_value``'s value that removes the field


def with_value(data: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with ``value`` at ``path`` (``DELETE`` removes it; the empty
    path replaces the whole of it)."""
    if not path:
        replaced: dict[str, Any] = copy.deepcopy(value)
        return replaced
    changed = copy.deepcopy(data)
    node: Any = changed
    for step in path[:-1]:
        node = node[step]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return changed


REQUEST_SCOPE = Scope("t", "w")


def forget_request(
    target: str = "mem_abc",
    *,
    scope: Scope = REQUEST_SCOPE,
    reason_ref: str = "reason:obsolete",
    summary: str = "",
    digest: str = "sha256:" + "1" * 64,
) -> ConfirmationRequest:
    """The confirmation alice is asked for before ``target`` is forgotten."""
    return ConfirmationRequest(
        tool="forget",
        target=target,
        operation_digest=digest,
        principal="alice",
        scope=scope,
        reason_ref=reason_ref,
        summary=summary,
    )


def initialize_request(client_name: str, request_id: int = 1) -> dict[str, Any]:
    """The JSON-RPC ``initialize`` request an MCP 2025-11-25 client opens with."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": client_name, "version": "1"},
        },
    }


GOLDEN_FILE = Path(__file__).resolve().parent / "fixtures" / "golden-payload.json"


def golden_payload() -> dict[str, Any]:
    """The golden payload (``fixtures/golden-payload.json``) as an agent writes it: no
    ``scope_ref``, which the host derives."""
    payload: dict[str, Any] = json.loads(GOLDEN_FILE.read_text(encoding="utf-8"))["payload"]
    del payload["scope_ref"]
    return payload


def capture_args(
    text: str = "Use WAL mode for the embedded store; it lets readers run beside one writer.",
    *,
    key: str = "capture-key-000001",
    valid_from: int = START_MS - 86_400_000,
    purpose: str = PURPOSE,
    **payload_overrides: Any,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "schema_version": 2,
        "purpose_ref": purpose,
        "valid_time": {"t": valid_from},
        "components": [
            {
                "component_id": "component:decision",
                "kind": "decision",
                "text": text,
                "citation_ids": ["citation:source"],
            }
        ],
        "primary_component_id": "component:decision",
        "primary_event": {
            "at": valid_from,
            "type_ref": "event:decided",
            "citation_id": "citation:source",
        },
        "citations": [
            {
                "citation_id": "citation:source",
                "source_ref": "source:design-notes",
                "locator": {"scheme": "document", "value": "notes#wal"},
                "content_digest": sha(text),
            }
        ],
    }
    payload.update(payload_overrides)
    return {
        "idempotency_key": key,
        "payload": payload,
        "evidence": {
            "evidence_ref": "evidence:review",
            "evidence_digest": sha("evidence:" + text),
            "citation_ids": ["citation:source"],
        },
    }


def esdk() -> aws_encryption_sdk.EncryptionSDKClient:
    """The Encryption SDK client the vaults' messages are read with (key commitment required)."""
    return aws_encryption_sdk.EncryptionSDKClient(
        commitment_policy=aws_encryption_sdk.CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT
    )


def raw_aes_keyring(namespace: str, key_name: str, wrapping_key: bytes) -> Any:
    """The Material Providers' raw AES keyring for one wrapping key."""
    return AwsCryptographicMaterialProviders(
        config=MaterialProvidersConfig()
    ).create_raw_aes_keyring(
        input=CreateRawAesKeyringInput(
            key_namespace=namespace,
            key_name=key_name,
            wrapping_key=wrapping_key,
            wrapping_alg=AesWrappingAlg.ALG_AES256_GCM_IV12_TAG16,
        )
    )


def decrypts_with(
    namespace: str, wrapping_key: bytes, key_name: str, ciphertext: bytes, plaintext: bytes
) -> bool:
    """Whether someone holding ``wrapping_key`` could decrypt ``ciphertext`` to ``plaintext`` with
    the Encryption SDK."""
    keyring = raw_aes_keyring(namespace, key_name, wrapping_key)
    decryptor = esdk().stream(mode="decrypt", source=io.BytesIO(ciphertext), keyring=keyring)
    try:
        found = decryptor.read()
    except Exception:
        return False
    finally:
        # Skip the SDK's own close, which raises again for a half-read message.
        io.IOBase.close(decryptor)
    return bool(found == plaintext)


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's HTTP/1.1 request handler that logs nothing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:
        return

    def body(self) -> bytes:
        """The request's body (``Content-Length`` bytes)."""
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""


@contextmanager
def served(server: uvicorn.Server, sock: socket.socket, what: str, stop_s: float) -> Iterator[None]:
    """Run ``server`` on ``sock`` in a background thread for the block (``what`` names it in the
    error when it has not started within 30 s); then stop it, waiting up to ``stop_s``."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=what, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.02)
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=stop_s)
        sock.close()


def run_in_threads(work: Callable[[int], object], count: int) -> None:
    """Run ``work(0)`` .. ``work(count - 1)`` on as many threads at once; wait for them all."""
    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def handled(engine: Engine, tool: str, arguments: Any, ctx: TrustedContext) -> dict[str, Any]:
    """One call straight to the engine that no human confirms (capture, search, get, ...): its
    envelope."""
    envelope = engine.handle(tool, arguments, ctx)
    assert not isinstance(envelope, ConfirmationNeeded), envelope
    return envelope


def remember_in(engine: Engine, text: str, key: str, ctx: TrustedContext | None = None) -> str:
    """Capture ``text`` and admit it straight through the engine: the record id."""
    captured = handled(engine, "capture", capture_args(text, key=key), ctx or context())
    admission = {"candidate_id": captured["output"]["value"]["candidate_id"]}
    admitted = handled(
        engine, "request_admission", {**admission, "idempotency_key": key + "-a"}, ctx or context()
    )
    record_id: str = admitted["output"]["value"]["outcome"]["record_id"]
    return record_id


def found_in(engine: Engine, query: str, ctx: TrustedContext | None = None, **options: Any) -> Any:
    """The search's value straight from the engine (``options``: the search's other fields)."""
    arguments = {"query": query, "purpose_ref": PURPOSE, **options}
    return handled(engine, "search", arguments, ctx or context())["output"]["value"]


LOCAL_HYBRID = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}


@dataclass
class Harness:
    """One engine over one adapter set, with the fakes a behavioural test steers."""

    engine: Engine
    store: Any
    vault: Any
    record_keys: Any
    index: Any
    clock: FakeClock
    confirmations: ScriptedConfirmations
    audit: MemoryAuditLog
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Every piece of key material the system still holds (for crypto-shredding checks).
    held_keys: Callable[[], list[bytes]] = field(default=lambda: [])
    _keys: int = 0

    def close(self) -> None:
        for close in self.closers:
            close()

    # -- calls ---------------------------------------------------------------------------------

    def call(self, tool: str, arguments: Any, ctx: TrustedContext | None = None) -> dict[str, Any]:
        """One call through the in-process transport, the scripted human in the loop."""
        return call_in_process(
            self.engine, tool, arguments, ctx or context(), self.confirmations.channel
        )

    def ok(self, tool: str, arguments: Any, ctx: TrustedContext | None = None) -> dict[str, Any]:
        envelope = self.call(tool, arguments, ctx)
        assert envelope["ok"], envelope
        value: dict[str, Any] = envelope["output"]["value"]
        return value

    def error(self, tool: str, arguments: Any, ctx: TrustedContext | None = None) -> str:
        envelope = self.call(tool, arguments, ctx)
        assert not envelope["ok"], envelope
        code: str = envelope["error"]["code"]
        return code

    # -- shortcuts -----------------------------------------------------------------------------

    def admission(self, text: str, key: str) -> dict[str, Any]:
        """Capture ``text`` (committed pending) and ask for its admission: that call's envelope."""
        captured = self.capture(text)
        assert captured["status"] == "committed_pending"
        arguments = {"candidate_id": captured["candidate_id"], "idempotency_key": key}
        return self.call("request_admission", arguments)

    def next_key(self, prefix: str = "key") -> str:
        self._keys += 1
        return f"{prefix}-{self._keys:012d}"

    def capture(
        self,
        text: str = "The deploy script needs the staging flag.",
        ctx: TrustedContext | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        key = kw.pop("key", None) or self.next_key("capture")
        return self.ok("capture", capture_args(text, key=key, **kw), ctx)

    def admit(
        self, candidate_id: str, ctx: TrustedContext | None = None, key: str | None = None
    ) -> dict[str, Any]:
        return self.ok(
            "request_admission",
            {"candidate_id": candidate_id, "idempotency_key": key or self.next_key("admit")},
            ctx,
        )

    def without_quality_gate(self) -> None:
        """The built-in policy without its quality gate (near-duplicates, low information): for
        tests that need records with (nearly) the same or very short text, e.g. to tie on score;
        not for tests about admission quality."""
        from engram_memory.policy.builtin import BuiltinAdmissionPolicy

        self.engine.policy = BuiltinAdmissionPolicy(near_duplicates="off", min_text_chars=0)

    def remember(
        self,
        text: str = "The deploy script needs the staging flag.",
        ctx: TrustedContext | None = None,
        **kw: Any,
    ) -> str:
        captured = self.capture(text, ctx, **kw)
        outcome = self.admit(captured["candidate_id"], ctx)["outcome"]
        assert outcome["status"] == "accepted", outcome
        record_id: str = outcome["record_id"]
        return record_id

    def search(self, query: str, ctx: TrustedContext | None = None, **kw: Any) -> dict[str, Any]:
        return self.ok("search", {"query": query, "purpose_ref": PURPOSE, **kw}, ctx)

    def get(self, record_id: str, ctx: TrustedContext | None = None) -> dict[str, Any]:
        return self.call("get", {"record_id": record_id, "purpose_ref": PURPOSE}, ctx)

    def forget(
        self, record_id: str, key: str | None = None, ctx: TrustedContext | None = None
    ) -> dict[str, Any]:
        return self._end("forget", {"record_id": record_id}, "reason:obsolete", key, ctx)

    def withdraw(
        self, candidate_id: str, key: str | None = None, ctx: TrustedContext | None = None
    ) -> dict[str, Any]:
        return self._end("withdraw", {"candidate_id": candidate_id}, "reason:mistake", key, ctx)

    def _end(
        self,
        tool: str,
        target: dict[str, str],
        reason_ref: str,
        key: str | None,
        ctx: TrustedContext | None,
    ) -> dict[str, Any]:
        """A forget or a withdraw: its envelope (the scripted human asked as the host asks)."""
        arguments = {
            **target,
            "idempotency_key": key or self.next_key(tool),
            "reason_ref": reason_ref,
        }
        return self.call(tool, arguments, ctx)


def embedded_harness(
    tmp_path: Path, *, fault_hook: Any = None, embedder: Any = None, **settings: Any
) -> Harness:
    from engram_memory.policy.builtin import BuiltinAdmissionPolicy

    clock = FakeClock()
    store = SqliteStore(tmp_path / "engram.db", fault_hook=fault_hook)
    master_key = b"\x07" * 32
    vault = LocalVault(tmp_path / "keys.db", master_key)
    index = SqliteLexicalIndex(store)
    confirmations = ScriptedConfirmations(clock)
    audit = MemoryAuditLog()
    engine = Engine(
        store=store,
        vault=vault,
        record_keys=vault.record_keys,
        lexical_index=index,
        admission_policy=BuiltinAdmissionPolicy(),
        clock=clock,
        audit=audit,
        settings=EngineSettings(cursor_key=b"\x01" * 32, **settings),
        embedder=embedder,
        vector_index=SqliteVectorIndex(store) if embedder is not None else None,
    )

    def held_keys() -> list[bytes]:
        import sqlite3

        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        from engram_memory.adapters.local.vault import _wrap_aad
        from engram_memory.engine.context import Scope

        keys = [master_key]
        scopes_and_candidates = [
            (Scope(row[0], row[1]), row[2])
            for row in sqlite3.connect(tmp_path / "engram.db").execute(
                "SELECT tenant_id, workspace_id, candidate_id FROM candidates"
            )
        ]
        with sqlite3.connect(tmp_path / "keys.db") as conn:
            for key_ref, nonce, wrapped in conn.execute(
                "SELECT key_ref, nonce, wrapped FROM data_keys"
            ):
                keys.append(bytes(wrapped)[:32])
                for scope, candidate_id in scopes_and_candidates:
                    try:
                        keys.append(
                            AESGCM(master_key).decrypt(
                                nonce, wrapped, _wrap_aad(key_ref, scope, candidate_id)
                            )
                        )
                    except Exception:  # noqa: S112 - wrong binding: not this row's key
                        continue
        return keys

    parts = (engine, store, vault, vault.record_keys, index, clock, confirmations, audit)
    return Harness(*parts, closers=[store.close, vault.close], held_keys=held_keys)


def aws_harness(tmp_path: Path, *, embedder: Any = None) -> Harness:
    """DynamoDB and S3 on moto (imported on first use: see ``aws_testing``)."""
    from aws_testing import aws_harness as build

    return build(tmp_path, embedder=embedder)


# Adapter sets the behavioural suite runs over.
HARNESS_FACTORIES: dict[str, Callable[[Path], Harness]] = {
    "embedded": embedded_harness,
    "aws": aws_harness,
}


def killed_child(
    argv: Sequence[str], *, paths: Sequence[Path] = (), env: Mapping[str, str] | None = None
) -> list[str]:
    """Run this interpreter on ``argv`` in a child process that must end killed (SIGKILL: a
    crash drill), with ``paths`` and tests/ before its ``PYTHONPATH``; the lines it printed."""
    child_env = {**os.environ, **(env or {})}
    search = [*map(str, paths), str(Path(__file__).resolve().parent)]
    child_env["PYTHONPATH"] = os.pathsep.join([*search, child_env.get("PYTHONPATH", "")])
    done = subprocess.run(  # noqa: S603 - our interpreter on our own drill
        [sys.executable, *argv],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def tool_missing(reason: str) -> NoReturn:
    """A test whose real tool (Chromium, node and npm, an npm package) is not here: skipped on a
    developer's machine, saying why; a failure in CI (``CI=true``), where every tool is set up and
    a skip would prove nothing."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"this test must run in CI: {reason}")
    pytest.skip(reason)
