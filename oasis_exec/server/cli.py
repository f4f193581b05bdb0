"""`python -m oasis_exec serve` (and `python -m oasis_exec.server`): build the engine, then serve it over HTTP.

`--port 0` binds a free port chosen by the OS. Once the socket is bound the server prints one line,
`OASIS_SERVER_LISTENING http://HOST:PORT`, on stdout, which scripts and tests read instead of guessing ports.

`--record FILE` (with `--record-hardware PRESET` off an H200/H100): when the server shuts down (SIGINT, SIGTERM),
what it served is written as a recording (`record.ServeLog`, `oasis_exec.recorder.recording_from_serve`) that
`python -m oasis_sim replay FILE` runs as an open-loop trace.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

LISTENING_PREFIX = "OASIS_SERVER_LISTENING"


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind")
    g.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one")
    g.add_argument("--served-model-name", help="name clients send as `model` (default: the --model preset, or a real "
                   "model's own name)")
    g.add_argument(
        "--max-waiting", type=int, default=256,
        help="requests accepted but not yet running, at most; beyond it the server answers 429",
    )
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    g.add_argument("--record", default=None, metavar="FILE",
                   help="at shutdown, write what was served as a recording (traces/SCHEMA.md, workload \"trace\") "
                        "for `python -m oasis_sim replay|validate`")
    g.add_argument("--record-hardware", default=None, metavar="PRESET",
                   help="simulator hardware preset of the recording (default: told from the GPU's name)")


def build_parser() -> argparse.ArgumentParser:
    from .adapter import add_engine_args

    p = argparse.ArgumentParser(
        prog="python -m oasis_exec serve",
        description="OpenAI-compatible streaming server (completions, chat completions, /metrics) on OasisKV.",
    )
    add_engine_args(p)
    add_server_args(p)
    return p


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .adapter import build_engine
    from .app import ServerConfig, create_app
    from .tokenizer import load_tokenizer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_waiting < 0:
        print(f"--max-waiting: must be >= 0, got {args.max_waiting}", file=sys.stderr)
        return 2
    try:
        engine = build_engine(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = engine.model_info
    try:
        tokenizer = load_tokenizer(None if info.dummy else info.model_dir)
    except (ValueError, OSError, ImportError) as exc:  # a real model is never served with the byte tokenizer
        print(f"error: the tokenizer of {info.model_dir}: {exc}", file=sys.stderr)
        return 2
    config = ServerConfig(served_model_name=args.served_model_name or info.name, max_waiting=args.max_waiting)
    served = None
    if getattr(args, "record", None):
        from oasis_exec.recorder import hardware_preset

        from .record import ServeLog

        device = info.device
        if device == "cuda":
            import torch

            device = torch.cuda.get_device_name()
        hardware = args.record_hardware or hardware_preset(device)
        if hardware is None:
            print(f"--record-hardware: cannot tell the simulator preset from device {device!r}; pass one",
                  file=sys.stderr)
            return 2
        served = ServeLog(args.record, engine, hardware=hardware,
                          server={"max_waiting": args.max_waiting, "served_model_name": config.served_model_name})
    app = create_app(engine, tokenizer, config, served)

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"--port: cannot bind {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"{LISTENING_PREFIX} http://{shown}:{port}", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5, access_log=False)
    )
    server.run(sockets=[sock])
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve(build_parser().parse_args(argv))
