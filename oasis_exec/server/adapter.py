"""Wrap the executor's engine (`oasis_exec.engine`) to the server's `ServingEngine` protocol.

Engine options come from `oasis_exec.config.ExecConfig`: every field becomes a `--kebab-case` flag with the
field's help, so the server accepts exactly the options the executor does. `--model` names a preset or a local
Hugging Face directory; `--dummy` forces random weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from .engine_protocol import EngineStats, ModelInfo, Sampling, StepOutput

_SKIP = {"model", "model_path"}  # handled by --model / --dummy


def _arg_type(annotation: str):
    base = annotation.replace(" ", "").replace("|None", "").replace("None|", "")
    return {"int": int, "float": float, "str": str, "dict": json.loads}.get(base, str)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    from oasis_exec.config import ExecConfig

    g = p.add_argument_group("engine (oasis_exec.config.ExecConfig)")
    g.add_argument("--model", default="tiny", help="oasis_core model preset, or a local Hugging Face directory")
    g.add_argument("--dummy", action="store_true", help="random weights (the model's shape from the preset)")
    for f in dataclasses.fields(ExecConfig):
        if f.name in _SKIP:
            continue
        flag = "--" + f.name.replace("_", "-")
        helptext = f.metadata.get("help", "")
        if str(f.type) == "bool":
            g.add_argument(flag, action="store_true", help=helptext)
        else:
            default = f.default if f.default is not dataclasses.MISSING else None
            g.add_argument(flag, type=_arg_type(str(f.type)), default=default,
                           help=f"{helptext} (default: {default})")


def exec_config_from_args(args: argparse.Namespace):
    from oasis_exec.config import ExecConfig

    kw: dict[str, Any] = {}
    for f in dataclasses.fields(ExecConfig):
        if f.name not in _SKIP and hasattr(args, f.name):
            kw[f.name] = getattr(args, f.name)
    if args.dummy or not os.path.isdir(args.model):
        kw["model"], kw["model_path"] = args.model, None
    else:
        kw["model"], kw["model_path"] = os.path.basename(os.path.normpath(args.model)), args.model
    return ExecConfig(**kw)


def build_engine(args: argparse.Namespace):
    cfg = exec_config_from_args(args)
    from oasis_exec.engine import Engine  # the executor's engine; imports torch

    return ExecutorEngine(Engine(cfg), cfg)


class ExecutorEngine:
    """`ServingEngine` over `oasis_exec.engine.Engine`."""

    def __init__(self, engine, cfg) -> None:
        self._eng = engine
        self._cfg = cfg
        self.model_info = ModelInfo(
            name=cfg.model, max_model_len=cfg.max_context, vocab_size=engine.vocab_size,
            eos_token_ids=(), model_dir=cfg.model_path, dummy=cfg.model_path is None, mode=cfg.mode,
            device=cfg.device,
        )

    def add_request(self, prompt_ids, sampling: Sampling):
        raise NotImplementedError

    def step(self) -> list[StepOutput]:
        raise NotImplementedError

    def abort(self, request_id) -> None:
        raise NotImplementedError

    def has_unfinished(self) -> bool:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError
