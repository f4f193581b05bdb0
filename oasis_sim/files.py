"""The files a simulator command reads and writes before any work: a YAML config (``--config``, a sweep's grid) and
an output folder (``--out``); each problem is a ``ConfigError`` of one line naming the path."""

from __future__ import annotations

import os

from oasis_core.echo import show

from .config import ConfigError


def load_config_file(path: str) -> dict:
    from .yaml_load import YamlError, load_yaml

    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or type(e).__name__}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    try:
        obj = load_yaml(text)
    except YamlError as e:
        raise ConfigError(f"{path}: {e}") from None
    if obj is None:
        raise ConfigError(f"{path}: empty file")
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: top level: must be a mapping of SimConfig fields, got {type(obj).__name__}")
    return obj


def prepare_out_dir(out_dir: str) -> None:
    """Create ``out_dir`` (a folder) before any work, so a bad ``--out`` costs one line, not a finished run."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out {out_dir}: exists and is not a folder")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out_dir}: cannot create: {e.strerror}") from None
    except RecursionError:  # os.makedirs recurses once per missing folder: thousands of them
        raise ConfigError(f"--out {show(out_dir)}: cannot create: too deeply nested") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out_dir}: not writable")
