"""``python -m oasis_exec <command>``: ``bench`` (closed-loop decode benchmark) and ``generate`` (smoke run).

Their options are generated from the dataclasses in ``oasis_exec.config`` (``oasis_core.cliargs``): every
``ExecConfig`` field is an engine option and every ``BenchConfig`` field a bench option, with the fields' defaults
and help; ``bench`` sets ``max_context`` itself (the prompt plus every decoded token). A bad option or value is one
line on stderr and exit status 2, checked before any work. The server adds ``serve`` through
``add_serve_command(subparsers)`` in ``oasis_exec.server`` when it exists, and ``quality`` its own commands.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

from oasis_core import cliargs
from oasis_core.cliargs import CliError, OneLineParser

from .cli_checks import writable_path
from .config import (
    BenchConfig,
    ExecConfig,
    add_bench_options,
    add_engine_options,
    bench_config,
    engine_config,
    replace_config,
)

BENCH_SETS = ("max_context",)  # ExecConfig fields bench derives from its own options


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m oasis_exec", description="OasisKV GPU executor")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)
    from .help_groups import ENGINE_GROUPS

    usage = "python -m oasis_exec {} [options] (--help: the options by subject)"
    b = sub.add_parser("bench", help="closed-loop decode benchmark at fixed concurrency", usage=usage.format("bench"))
    add_bench_options(b.add_argument_group("bench: the run (oasis_exec.config.BenchConfig)"))
    add_engine_options(b, exclude=BENCH_SETS, groups=ENGINE_GROUPS)
    g = sub.add_parser("generate", help="generate from token ids (smoke test)", usage=usage.format("generate"))
    add_engine_options(g, groups=ENGINE_GROUPS)
    g.add_argument("--prompt-ids", default="1,2,3,4", help="comma-separated token ids (default: 1,2,3,4)")
    g.add_argument("--max-tokens", type=int, default=16, help="tokens to generate (default: 16)")
    try:
        from .server import add_serve_command  # the server's hook
    except ImportError:
        add_serve_command = None
    if add_serve_command is not None:
        add_serve_command(sub)
    from .tools.quality.cli import add_quality_command

    add_quality_command(sub)
    return ap


def prepare_bench(a) -> tuple[ExecConfig, BenchConfig]:
    """The configs of a ``bench`` command line, validated, and its files checked; ``CliError`` when bad."""
    bc = bench_config(a)
    if bc.prompt_text is not None:
        npz = ".npz:" in bc.prompt_text  # token ids: no tokenizer needed, so dummy weights can prefill them too
        if not npz and not getattr(a, "model_path", None):
            raise CliError(
                "--prompt-text FILE needs --model-path (a real model and its tokenizer; or FILE.npz:KEY ids)"
            )
        if npz:  # token ids made elsewhere: checked (file, key, row) before anything loads
            from .tools.quality.generation import npz_ids

            try:
                npz_ids(bc.prompt_text, 1, "--prompt-text")
            except ValueError as e:
                raise CliError(str(e)) from None
        elif not os.path.isfile(bc.prompt_text):
            raise CliError(f"--prompt-text {bc.prompt_text}: no such file")
    chain = getattr(a, "decode_chain", ExecConfig.decode_chain)  # an option not given is absent from ``a``
    spec_chain = getattr(a, "spec_chain", ExecConfig.spec_chain)
    if bc.record is not None:  # the simulator replays single decode steps (said once all is valid)
        a.decode_chain = a.spec_chain = 1
    # validated with one token a step first (a bound >= one block, as the config requires); then the prompt, every
    # token the steps emit (a speculative step or a decode chain: several) and two blocks of slack
    block_size = getattr(a, "block_size", ExecConfig.block_size)
    cfg = engine_config(a, exclude=BENCH_SETS, max_context=bc.engine_max_context(block_size))
    cfg = replace_config(cfg, max_context=bc.engine_max_context(cfg.block_size, cfg.step_tokens_max - 1))
    if bc.record_hardware is not None:
        from oasis_core.specs import HARDWARE

        if bc.record_hardware not in HARDWARE:
            raise CliError(
                f"--record-hardware: must be one of {', '.join(sorted(HARDWARE))}, got {bc.record_hardware!r}"
            )
    elif bc.record is not None and cfg.device == "cpu":
        raise CliError("--record on the CPU needs --record-hardware (the simulator preset the recording is for)")
    writable_path("--out", bc.out)
    writable_path("--record", bc.record)
    if bc.record is not None and chain != 1:
        print(f"--record: decode_chain {chain} -> 1 (a recording's steps are single decode steps)", file=sys.stderr)
    if bc.record is not None and spec_chain != 1 and cfg.speculative_k:
        print(f"--record: spec_chain {spec_chain} -> 1 (likewise a speculative step a scheduler step)", file=sys.stderr)
    return cfg, bc


def prepare_generate(a) -> tuple[ExecConfig, list[int]]:
    cfg = engine_config(a)
    try:
        ids = [int(t) for t in a.prompt_ids.split(",")]
    except ValueError:
        raise CliError(f"--prompt-ids: must be comma-separated integers, got {a.prompt_ids!r}") from None
    if not ids or min(ids) < 0:
        raise CliError(f"--prompt-ids: must be one or more integers >= 0, got {a.prompt_ids!r}")
    if a.max_tokens < 1:
        raise CliError(f"--max-tokens: must be >= 1, got {a.max_tokens}")
    if len(ids) + a.max_tokens > cfg.max_context:
        raise CliError(
            f"--prompt-ids and --max-tokens: {len(ids)} + {a.max_tokens} tokens exceed --max-context {cfg.max_context}"
        )
    return cfg, ids


CPU_RUN = (
    "--device cpu --dtype float32 --model tiny --top-k 4 --selection synthetic --context 512 --concurrency 2 --steps 4"
)


def check_device(cfg: ExecConfig) -> None:
    """A CUDA device asked for where torch sees none: one line saying so and how to run on the CPU (``CliError``)."""
    if not cfg.device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise CliError(
            f"--device {cfg.device}: no CUDA device here (torch {torch.__version__}); "
            f"on the CPU: add {CPU_RUN} (the GPU figures need a GPU)"
        )


def _prompt_tokens(path: str, model_path: str, option: str = "--prompt-text") -> list:
    """A text file's tokens by the model's tokenizer, or ``FILE.npz:KEY[:ROW]``'s token ids as they are (e.g. the
    32K-token Gemma texts of ``experiments/long_context_draft/data/gemma_32k.npz``, made where its tokenizer runs)."""
    if ".npz:" in path:
        from .tools.quality.generation import npz_ids

        return npz_ids(path, 1 << 62, option)[1]
    from .server.tokenizer import load_tokenizer

    with open(path, encoding="utf-8", errors="replace") as fh:
        return load_tokenizer(model_path).encode(fh.read())


def run_bench_command(cfg: ExecConfig, bc: BenchConfig) -> int:
    check_device(cfg)
    from .tools.bench import run_bench, run_bench_tp, write_record

    toks = _prompt_tokens(bc.prompt_text, cfg.model_path) if bc.prompt_text else None
    args = (cfg, bc.context, bc.concurrency, bc.steps, bc.warmup, bc.host_fill, toks, bc.prompt_text)
    rec = run_bench(*args) if cfg.tensor_parallel == 1 else run_bench_tp(*args)
    if rec is None:  # a torchrun rank other than 0
        return 0
    write_record(rec, bc.out)
    if bc.record:
        from .tools.recorder import write_bench_recording

        write_bench_recording(bc.record, rec, cfg, hardware=bc.record_hardware)
        print(f"wrote recording {bc.record}", file=sys.stderr)
    return 0


def run_generate_command(cfg: ExecConfig, ids: list[int], max_tokens: int) -> int:
    check_device(cfg)
    from .engine.engine import Engine
    from .engine.scheduler import SamplingParams

    eng = Engine(cfg)
    try:
        vocab = eng.runner.shape.vocab
        if max(ids) >= vocab:
            raise CliError(f"--prompt-ids: token ids must be < the model's vocabulary of {vocab}, got {max(ids)}")
        out = eng.generate([ids], SamplingParams(max_tokens=max_tokens))
    finally:
        eng.close()
    print(json.dumps({"output_ids": out[0]}))
    return 0


def _out_of_memory(e: BaseException) -> bool:
    torch = sys.modules.get("torch")
    return isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError))


def _interrupted(signum, frame):
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def main(argv=None) -> int:
    """Every command; Ctrl-C (SIGINT) at any point, model loading included, ends it with one line and status 130,
    not a traceback (a running server first ends its requests, ``oasis_exec.server.lifecycle``)."""
    # Until a command installs its own (the server's graceful shutdown), SIGINT ends the process at once: a
    # KeyboardInterrupt raised inside a library while loading can come out wrapped (pydantic's SchemaError), so
    # catching it is not enough.
    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers are its alone
    before = signal.signal(signal.SIGINT, _interrupted) if main_thread else None
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if main_thread:  # a caller's own handler back (tests call main in-process)
            signal.signal(signal.SIGINT, before)


def _main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.cmd not in ("bench", "generate"):
        if not hasattr(a, "func"):
            return 1
        try:
            return a.func(a) or 0
        except (CliError, ValueError, OSError) as e:  # bad input found by a command's own checks (quality, serve)
            print(
                f"{ap.prog} {' '.join(x for x in (a.cmd, getattr(a, 'quality_cmd', None)) if x)}: error: "
                f"{cliargs.one_line(e)}",
                file=sys.stderr,
            )
            return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the library's notes (clipping) on stderr
    prog = f"{ap.prog} {a.cmd}"
    try:
        if a.cmd == "bench":
            return run_bench_command(*prepare_bench(a))
        cfg, ids = prepare_generate(a)
        return run_generate_command(cfg, ids, a.max_tokens)
    except CliError as e:
        print(f"{prog}: error: {cliargs.one_line(e)}", file=sys.stderr)
    except (ValueError, OSError) as e:  # bad input found while building or running: the engine's own message
        print(f"{prog}: error: {cliargs.option_message(ExecConfig, str(e))}", file=sys.stderr)
    except Exception as e:
        if not _out_of_memory(e):
            raise
        print(f"{prog}: error: out of memory: {cliargs.one_line(e)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
