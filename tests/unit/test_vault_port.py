"""What every vault promises (the ``Vault`` port), on the embedded key file and on KMS (moto)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_kms_vault import SCOPE, SECRET, _assert_reveals_nothing, _vault, aws, session

from engram_memory.adapters.local.vault import LocalVault, load_or_create_master_key
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SealIntegrityError, Vault

__all__ = ["aws", "session"]  # the KMS vault's fixtures, re-used


@pytest.fixture(params=["local", "kms"])
def vault(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Vault]:
    if request.param == "kms":
        yield _vault(request.getfixturevalue("aws"))
        return
    master_key = load_or_create_master_key(tmp_path / "secrets" / "master.key")
    local = LocalVault(tmp_path / "vault" / "keys.sqlite3", master_key)
    yield local
    local.close()


def test_a_vault_satisfies_the_vault_port(vault: Vault) -> None:
    assert vault.key_exists("key_missing") is False


@pytest.mark.parametrize("plaintext", [SECRET, b"", bytes(range(256)) * 300])
def test_a_sealed_blob_opens_back_to_its_plaintext(vault: Vault, plaintext: bytes) -> None:
    blob = vault.seal(SCOPE, "cand_1", plaintext)

    assert blob.key_ref.startswith("key_")
    assert len(blob.key_ref) == len("key_") + 32
    assert vault.key_exists(blob.key_ref)
    assert vault.open(SCOPE, "cand_1", blob) == plaintext


@pytest.mark.parametrize(
    ("scope", "candidate_id"),
    [
        (Scope("tenant-b", "workspace-1"), "cand_1"),
        (Scope("tenant-a", "workspace-2"), "cand_1"),
        (SCOPE, "cand_2"),
    ],
    ids=["other-tenant", "other-workspace", "other-candidate"],
)
def test_opening_in_another_scope_or_for_another_candidate_fails_integrity(
    vault: Vault, scope: Scope, candidate_id: str
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    with pytest.raises(SealIntegrityError) as failure:
        vault.open(scope, candidate_id, blob)
    _assert_reveals_nothing(failure.value, SECRET, blob.ciphertext[-48:])
    assert vault.open(SCOPE, "cand_1", blob) == SECRET
