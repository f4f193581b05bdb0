"""Reading a model's files with errors that name the file and the problem.

A Hugging Face directory's ``config.json`` / ``tokenizer_config.json`` / ``generation_config.json``, its
``*.safetensors`` weights, a ``.npz`` corpus: each reader here raises ``ModelFileError`` (a ``ValueError``:
the CLIs print it as one line and exit 2) saying ``<path>: <what is wrong>`` — a missing file, one that is not
JSON (with line and column), a missing or mistyped field, a corrupt weights file — never a bare path or a
parser's message without the file.
"""

from __future__ import annotations

import json


class ModelFileError(ValueError):
    """A model file that is missing or unreadable; the message names the file and the problem."""


def read_json_file(path: str, what: str = "JSON file") -> dict:
    """The JSON object in ``path``; ``what`` says what the file is for (``a model's config.json``)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file ({what})") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read ({what}): {e.strerror or type(e).__name__}") from None
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelFileError(f"{path}: not UTF-8 text ({what}): byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}: not valid JSON ({what}): {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:
        raise ModelFileError(f"{path}: not valid JSON ({what}): {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{path}: must hold a JSON object ({what}), got {type(obj).__name__}")
    return obj


def load_safetensors_file(path: str) -> dict:
    """The tensors of one ``.safetensors`` file (on the CPU)."""
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read: {e.strerror or type(e).__name__}") from None
    except Exception as e:  # noqa: BLE001 - SafetensorError, a Rust panic (BaseException subclasses are not caught)
        raise ModelFileError(f"{path}: not a valid .safetensors file ({' '.join(str(e).split())[:120]})") from None


class GGUFError(ValueError):
    """A GGUF file this loader cannot run correctly (unsupported architecture, RoPE scaling, ...)."""
