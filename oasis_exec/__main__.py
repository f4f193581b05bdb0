"""``python -m oasis_exec <command>``: ``bench`` (closed-loop decode benchmark) and ``generate`` (smoke run).

The server adds ``serve`` through ``add_serve_command(subparsers)`` in ``oasis_exec.server`` when it exists.
"""
from __future__ import annotations

import argparse
import json
import sys

from .config import ExecConfig


def _engine_args(p: argparse.ArgumentParser) -> None:
    h = ExecConfig.help()
    p.add_argument("--model", default="qwen3-8b", help=h["model"])
    p.add_argument("--model-path", default=None, help=h["model_path"])
    p.add_argument("--dummy", action="store_true", help="random weights (the default when no --model-path)")
    p.add_argument("--draft-path", default=None, help=h["draft_path"])
    p.add_argument("--device", default="cuda", help=h["device"])
    p.add_argument("--dtype", default="bfloat16", help=h["dtype"])
    p.add_argument("--mode", default="lookahead", help=h["mode"])
    p.add_argument("--selection", default="model", help=h["selection"])
    p.add_argument("--replay-path", default=None, help=h["replay_path"])
    p.add_argument("--record-path", default=None, help=h["record_path"])
    p.add_argument("--top-k", type=int, default=128, help=h["top_k"])
    p.add_argument("--block-size", type=int, default=16, help=h["block_size"])
    p.add_argument("--fetch-ratio", type=float, default=0.05, help=h["fetch_ratio"])
    p.add_argument("--kv-budget-gb", type=float, default=None, help=h["kv_budget_gb"])
    p.add_argument("--host-kv-gb", type=float, default=None, help=h["host_kv_gb"])
    p.add_argument("--max-lanes", type=int, default=None, help=h["max_lanes"])
    p.add_argument("--transfer", default="auto", help=h["transfer"])
    p.add_argument("--host-threads", type=int, default=8, help=h["host_threads"])
    p.add_argument("--host-kernel", default="auto", help=h["host_kernel"])
    p.add_argument("--uva-programs", type=int, default=32, help=h["uva_programs"])
    p.add_argument("--stream-priority", default="auto", help=h["stream_priority"])
    p.add_argument("--copy-graph", default="auto", help=h["copy_graph"])
    p.add_argument("--uva-kernel", default="loads", help=h["uva_kernel"])
    p.add_argument("--no-transfer", action="store_true", help=h["no_transfer"])
    p.add_argument("--seed", type=int, default=0, help=h["seed"])
    p.add_argument("--profile", action="store_true", help=h["profile"])
    p.add_argument("--no-cuda-graph", action="store_true", help="run decode steps eagerly (" + h["cuda_graph"] + ")")
    p.add_argument("--no-fused-ops", action="store_true", help="turn off: " + h["fused_ops"])
    p.add_argument("--synthetic", default=None, help="JSON of SyntheticParams overrides, e.g. '{\"drift_rate\": 0.2}'")


def _config(a, max_context: int) -> ExecConfig:
    if a.model_path and a.dummy:
        raise SystemExit("--dummy and --model-path exclude each other")
    return ExecConfig(model=a.model, model_path=a.model_path, draft_path=a.draft_path, device=a.device,
                      dtype=a.dtype, mode=a.mode, selection=a.selection, replay_path=a.replay_path,
                      record_path=a.record_path, top_k=a.top_k, block_size=a.block_size, fetch_ratio=a.fetch_ratio,
                      max_context=max_context, kv_budget_gb=a.kv_budget_gb, host_kv_gb=a.host_kv_gb,
                      max_lanes=a.max_lanes, transfer=a.transfer, host_threads=a.host_threads,
                      host_kernel=a.host_kernel, uva_programs=a.uva_programs, stream_priority=a.stream_priority,
                      copy_graph=a.copy_graph,
                      uva_kernel=a.uva_kernel, no_transfer=a.no_transfer, seed=a.seed, profile=a.profile,
                      cuda_graph=not a.no_cuda_graph, fused_ops=not a.no_fused_ops,
                      synthetic=json.loads(a.synthetic) if a.synthetic else None)


def _prompt_tokens(path: str, model_path: str | None) -> list:
    if not model_path:
        raise SystemExit("--prompt-text needs --model-path (a real model and its tokenizer)")
    from .server.tokenizer import load_tokenizer

    with open(path, encoding="utf-8", errors="replace") as fh:
        return load_tokenizer(model_path).encode(fh.read())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="oasis_exec", description="OasisKV GPU executor")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="closed-loop decode benchmark at fixed concurrency")
    _engine_args(b)
    b.add_argument("--context", type=int, default=16384)
    b.add_argument("--concurrency", type=int, default=8)
    b.add_argument("--steps", type=int, default=32)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--out", default=None, help="append the JSON record to this file")
    b.add_argument("--record", default=None, metavar="FILE",
                   help="also write the run as a recording (traces/SCHEMA.md) for `python -m oasis_sim replay|validate`")
    b.add_argument("--record-hardware", default=None, metavar="PRESET",
                   help="simulator hardware preset of the recording (default: told from the GPU's name)")
    b.add_argument("--prompt-text", default=None, metavar="FILE",
                   help="cut the prompts from this real text (tokenized by the model's tokenizer) and prefill them for "
                        "real, instead of synthesizing random KV; for selection=model on real weights")
    b.add_argument("--no-host-fill", action="store_true",
                   help="leave the pinned host pool unwritten (copies time the same; saves a pass over it)")
    g = sub.add_parser("generate", help="generate from token ids (smoke test)")
    _engine_args(g)
    g.add_argument("--prompt-ids", default="1,2,3,4", help="comma-separated token ids")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--max-context", type=int, default=4096)
    try:
        from .server import add_serve_command  # noqa: F401  (the server engineer's hook)
    except Exception:
        add_serve_command = None
    if add_serve_command is not None:
        add_serve_command(sub)
    from .quality.cli import add_quality_command

    add_quality_command(sub)
    a = ap.parse_args(argv)
    if a.cmd == "bench":
        from .bench import run_bench, write_record

        cfg = _config(a, a.context + a.warmup + a.steps + 2 * a.block_size)
        toks = _prompt_tokens(a.prompt_text, a.model_path) if a.prompt_text else None
        rec = run_bench(cfg, a.context, a.concurrency, a.steps, a.warmup, not a.no_host_fill, toks, a.prompt_text)
        write_record(rec, a.out)
        if a.record:
            from .recorder import write_bench_recording

            write_bench_recording(a.record, rec, cfg, hardware=a.record_hardware)
            print(f"wrote recording {a.record}", file=sys.stderr)
        return 0
    if a.cmd == "generate":
        from .engine import Engine
        from .scheduler import SamplingParams

        eng = Engine(_config(a, a.max_context))
        out = eng.generate([[int(t) for t in a.prompt_ids.split(",")]], SamplingParams(max_tokens=a.max_tokens))
        print(json.dumps({"output_ids": out[0]}))
        eng.close()
        return 0
    if hasattr(a, "func"):
        return a.func(a) or 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
