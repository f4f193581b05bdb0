"""`python -m oasis_exec serve` (and `python -m oasis_exec.server`): build the engine, then serve it over HTTP.

`--port 0` binds a free port chosen by the OS. Once the socket is bound the server prints one line,
`OASIS_SERVER_LISTENING http://HOST:PORT`, on stdout, which scripts and tests read instead of guessing ports.

`--record FILE` (with `--record-hardware PRESET` off an H200/H100): when the server shuts down (SIGINT, SIGTERM),
what it served is written as a recording (`record.ServeLog`, `recording.recording_from_serve`) that
`python -m oasis_sim replay FILE` runs as an open-loop trace.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import typing

from oasis_core.cliargs import one_line

from ..cli_checks import writable_path
from .config import FIELDS, ServerConfig

LISTENING_PREFIX = "OASIS_SERVER_LISTENING"


def _one_line_error(parser: argparse.ArgumentParser):
    def error(message: str):  # one line, exit 2 (argparse would print the usage too)
        parser.exit(2, f"{parser.prog}: error: {one_line(message)}\n")

    return error


def add_server_args(p: argparse.ArgumentParser) -> None:
    """One flag a `ServerConfig` field, with the field's help (see config.py)."""
    p.error = _one_line_error(p)  # also on `python -m oasis_exec serve`, a subparser of another parser
    g = p.add_argument_group("server (oasis_exec.server.config.ServerConfig)")
    hints = typing.get_type_hints(ServerConfig)
    for f in FIELDS:
        flag, kind, meta = "--" + f.name.replace("_", "-"), hints[f.name], f.metadata
        if kind is bool:
            g.add_argument(flag, action="store_true", help=meta["help"])
            continue
        if typing.get_origin(kind) is tuple:
            g.add_argument(
                flag,
                nargs="+",
                default=f.default,
                metavar=meta.get("metavar", "VALUE"),
                help=f"{meta['help']} (default: {' '.join(f.default) or 'none'})",
            )
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)  # X | None -> X
        g.add_argument(
            flag,
            type=base,
            default=f.default,
            choices=meta.get("choices"),
            metavar=meta.get("metavar"),
            help=f"{meta['help']} (default: {f.default})",
        )


PROG = "python -m oasis_exec serve"


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Raises ValueError naming the field (`--flag: why, got value`)."""
    kw = {f.name: getattr(args, f.name) for f in FIELDS}
    kw.update({k: tuple(v) for k, v in kw.items() if isinstance(v, list)})
    try:
        return ServerConfig(**kw)
    except ValueError as exc:
        name, sep, rest = str(exc).partition(":")
        raise ValueError(f"--{name.replace('_', '-')}:{rest}" if sep else str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from .adapter import add_engine_args

    p = argparse.ArgumentParser(
        prog=PROG,
        description="OpenAI-compatible streaming server (completions, chat completions, /metrics) on OasisKV.",
    )
    add_engine_args(p)
    add_server_args(p)
    return p


def set_chat_template(tokenizer, path: str) -> None:
    """``--chat-template FILE``: the file's Jinja template replaces the tokenizer's (a real model's tokenizer only:
    the byte tokenizer of a dummy model has its own minimal one)."""
    if not hasattr(tokenizer, "chat_template"):
        raise ValueError("a dummy model's byte tokenizer takes no chat template")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    from .tokenizer import _compile_template

    try:
        _compile_template(text)
    except Exception as exc:  # noqa: BLE001 - jinja2's syntax errors
        raise ValueError(f"not a valid Jinja template ({exc})") from None
    tokenizer.chat_template = text


def serve(args: argparse.Namespace) -> int:
    from uvicorn import Config

    from .adapter import build_engine
    from .app import create_app
    from .lifecycle import GracefulServer
    from .tokenizer import load_tokenizer

    try:
        config = server_config_from_args(args)
        writable_path("--record", config.record)  # checked now, not when the server stops and writes it
    except ValueError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine = build_engine(args)
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    info = engine.model_info
    try:
        tokenizer = load_tokenizer(None if info.dummy else info.model_dir)
    except (ValueError, OSError, ImportError) as exc:  # a real model is never served with the byte tokenizer
        print(f"{PROG}: error: the tokenizer of {info.model_dir}: {one_line(exc)}", file=sys.stderr)
        return 2
    if config.chat_template:
        try:
            set_chat_template(tokenizer, config.chat_template)
        except (ValueError, OSError) as exc:
            print(f"error: --chat-template {config.chat_template}: {exc}", file=sys.stderr)
            return 2
    served_name = config.served_model_name or info.name
    try:
        served = _serve_log(config, engine, info, served_name) if config.record else None
        sock = _bind(config)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    app = create_app(engine, tokenizer, config, served)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
    print(f"{LISTENING_PREFIX} http://{shown}:{port}", flush=True)
    server = GracefulServer(
        Config(app, log_level=config.log_level, timeout_graceful_shutdown=5, access_log=False),
        engine_loop=app.state.engine_loop,
        grace_s=config.shutdown_grace_s,
    )
    server.run(sockets=[sock])
    return 0


def _serve_log(config, engine, info, served_name):
    """``--record``: the log the server writes its recording from (ValueError: the simulator preset is unknown)."""
    from oasis_core.recording_parts import hardware_preset

    from .record import ServeLog

    device = info.device
    if device == "cuda":
        import torch

        device = torch.cuda.get_device_name()
    hardware = config.record_hardware or hardware_preset(device)
    if hardware is None:
        raise ValueError(f"--record-hardware: cannot tell the simulator preset from device {device!r}; pass one")
    server = {"max_waiting": config.max_waiting, "served_model_name": served_name}
    return ServeLog(config.record, engine, hardware=hardware, server=server)


def _bind(config) -> socket.socket:
    """The listening socket on ``--host``/``--port`` (ValueError: it cannot bind)."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"--port: cannot bind {config.host}:{config.port}: {exc.strerror}") from None
    sock.listen(2048)
    return sock


def parse_config(argv: list[str] | None = None) -> tuple[argparse.Namespace, ServerConfig]:
    """Parse and validate the server's options without starting anything; bad input exits 2 with one line."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        return args, server_config_from_args(args)
    except ValueError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    args, _ = parse_config(argv)
    return serve(args)
