"""Issue 35, class 3: every reader of every file format the project accepts, given a corrupt file (empty, random
bytes, cut short at several points, bytes flipped inside, deeply nested, not UTF-8), raises its own ``ValueError``
subclass with a message naming the file: never ``zipfile.BadZipFile``, ``zlib.error``, ``EOFError``,
``RecursionError``, ``UnicodeDecodeError``, a ``KeyError`` or a Rust panic. A corrupt file is a bad input
(exit 2, one line), not a crash."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "traces" / "recordings" / "dense-8k-c8.json"


def _corruptions(valid: bytes) -> dict:
    rng = random.Random(35)
    n = len(valid)
    flipped = bytearray(valid)
    for i in range(n // 2, min(n, n // 2 + 16)):
        flipped[i] ^= 0xFF
    out = {
        "empty": b"",
        "garbage": bytes(rng.getrandbits(8) for _ in range(4096)),
        "nul": b"\0" * 512,
        "not-utf8": b"\xff\xfe\xfa" * 100,
        "nested": b"[" * 200_000,
        "half": valid[: n // 2],
        "three-quarters": valid[: 3 * n // 4],
        "last-byte-cut": valid[:-1],
        "first-bytes": valid[:12],
        "flipped": bytes(flipped),
    }
    if valid[:2] == b"PK":  # a zip (.npz): its central directory intact, a member's data broken
        z = bytearray(valid)
        z[40:60] = bytes(20)
        out["zip-member-zeroed"] = bytes(z)
    return out


def _check(read, path: Path, valid: bytes, exc=ValueError):
    for kind, data in _corruptions(valid).items():
        path.write_bytes(data)
        try:
            read(str(path))
        except exc as e:
            msg = str(e)
            assert path.name in msg, f"{kind}: the message does not name the file: {msg}"
            assert "\n" not in msg.strip() and len(msg) < 1200, f"{kind}: {msg[:2000]}"
        except BaseException as e:  # noqa: BLE001 - anything else is the failure under test
            pytest.fail(f"{kind}: {type(e).__name__}: {str(e)[:300]}")
        # a corruption may still be readable (a flipped byte inside a string): that is not a crash


def _trace_bytes() -> bytes:
    reqs = [{"id": i, "arrival_s": i * 0.1, "prompt_tokens": 600, "output_tokens": 3} for i in range(4)]
    return json.dumps({"schema": "oasiskv-trace", "version": 1, "requests": reqs}).encode()


def test_trace_json(tmp_path):
    from oasis_core.trace import load_trace
    from oasis_core.trace_stream import load_trace_stream

    _check(load_trace, tmp_path / "t.json", _trace_bytes())
    _check(lambda p: load_trace_stream(p, chunk_bytes=64), tmp_path / "s.json", _trace_bytes())


def test_recording_json(tmp_path):
    from oasis_core.recording import load_recording

    _check(load_recording, tmp_path / "r.json", RECORDING.read_bytes())


def test_selection_npz(tmp_path):
    from oasis_core.recording import load_selection, save_selection

    p = tmp_path / "valid.npz"
    save_selection(p, np.arange(3 * 4 * 5).reshape(3, 4, 5) % 7, [0, 1])
    _check(load_selection, tmp_path / "sel.npz", p.read_bytes())


def test_setrecord_npz(tmp_path):
    from oasis_core.setrecord import SetRecorder, load_setrecord

    p = tmp_path / "valid.npz"
    r = SetRecorder(str(p), {"mode": "lookahead", "n_layers": 2, "n_kv_heads": 2, "top_k": 3})
    for k in range(4):
        r.add_step(np.full((2, 2, 3), k), [7], [48 + k], [4])
    r.write()
    _check(load_setrecord, tmp_path / "rec.npz", p.read_bytes())


def test_mooncake_and_azure_imports(tmp_path):
    from oasis_core.importers import import_azure, import_mooncake

    moon = b'{"timestamp": 0, "input_length": 900, "output_length": 3, "hash_ids": [0, 1]}\n' * 3
    _check(import_mooncake, tmp_path / "m.jsonl", moon)
    azure = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n" * 2
    _check(import_azure, tmp_path / "a.csv", azure)


def test_sim_config_grid_and_replay_sets(tmp_path):
    from oasis_sim.cli import load_config_file
    from oasis_sim.policy import ReplaySets
    from oasis_sim.sweep import load_grid

    _check(load_config_file, tmp_path / "c.yaml", b"mode: lookahead\ntop_k: 64\nsynthetic: {drift_rate: 0.1}\n")
    _check(load_grid, tmp_path / "g.yaml", b"base: {max_requests: 2}\ngrid:\n  mode: [dense, lookahead]\n")
    sets = {"top_k": 2, "n_blocks": 8, "initial": [[0, 1]], "steps": [{"true_next": [[1, 2]], "draft": [[1, 2]]}]}
    _check(lambda p: ReplaySets(p, 2), tmp_path / "sets.json", json.dumps(sets).encode())


def test_gguf(tmp_path):
    gguf_model = pytest.importorskip("oasis_exec.model.gguf")
    try:
        real = Path(gguf_model.smollm2_path())
    except (ImportError, FileNotFoundError):
        pytest.skip("the SmolLM2 GGUF is not installed")
    with open(real, "rb") as f:
        head = f.read(1 << 20)  # the header and metadata; the tensors are cut off
    _check(gguf_model.read_gguf, tmp_path / "m.gguf", head)


def _hf_dir(tmp_path) -> Path:
    """A tiny Hugging Face directory: config.json, tokenizer files, one safetensors file."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    d = tmp_path / "hf"
    d.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "vocab_size": 300,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({"model.embed_tokens.weight": torch.zeros(300, 64)}, str(d / "model.safetensors"))
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "b"}))
    return d


def test_hf_model_directory(tmp_path):
    import torch

    d = _hf_dir(tmp_path)
    from oasis_exec.model.decoder import load_safetensors_dir
    from oasis_exec.server.adapter import real_model
    from oasis_exec.server.tokenizer import load_tokenizer

    valid_cfg = (d / "config.json").read_bytes()
    _check(lambda p: real_model.__wrapped__(str(Path(p).parent)), d / "config.json", valid_cfg)
    (d / "config.json").write_bytes(valid_cfg)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        valid = (d / name).read_bytes()
        _check(lambda p: load_tokenizer(str(Path(p).parent)), d / name, valid)
        (d / name).write_bytes(valid)
    st = d / "model.safetensors"
    valid = st.read_bytes()
    _check(lambda p: load_safetensors_dir(str(Path(p).parent), torch.float32, "cpu"), st, valid)


def test_draft_corpus_npz(tmp_path):
    from oasis_exec.tools.draft_train import read_corpus

    p = tmp_path / "valid.npz"
    np.savez(p, train=np.zeros((2, 8), np.int32), held=np.zeros((1, 8), np.int32))
    _check(read_corpus, tmp_path / "corpus.npz", p.read_bytes())


def test_transfer_table(tmp_path):
    from oasis_exec.transfer.choice import TABLE, load_table

    _check(load_table, tmp_path / "table.json", Path(TABLE).read_bytes())


def test_trace_dir_given_as_a_file_is_named(tmp_path):
    """Not a corruption but the same class: a folder where a file is expected."""
    from oasis_core.recording import load_selection

    d = tmp_path / "dir.npz"
    d.mkdir()
    with pytest.raises(ValueError, match="dir.npz"):
        load_selection(d)
    shutil.rmtree(d)
