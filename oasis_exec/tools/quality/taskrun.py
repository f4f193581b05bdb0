"""``python -m oasis_exec quality tasks``: long-context task accuracy per mode x K x fetch through the engine (issue
37), on a real model.

The tasks (``longtasks.py``: passkey at several depths, multi-key, variable tracking, from real filler) come from a
task file (``--tasks-file``, made by ``--make-tasks`` where a tokenizer runs; the device needs none) or are built
here with the model's Hugging Face tokenizer. Each task is a greedy request of ``answer_tokens`` through the engine
(``endtoend.run_engine``: the served decode path, its prediction, capped selection and prefetch), per variant
(``endtoend.variants``: dense first, then lookahead and proxy at each fetch ratio and K, then retrieval), at most
``--max-lanes`` requests an engine; ``--block-scores A B ...`` runs every selecting variant once per block scorer
(``ExecConfig.block_score``; the engine's default alone otherwise). The continuation is decoded (``--tokenizer
gguf``: the project's tokenizer from the GGUF metadata, ``oasis_exec.server.tokenizer``; ``hf``: transformers') and
scored by ``longtasks.score``.

Per group (``passkey@<depth>``, ``multikey``, ``vartrack``) dense's accuracy decides whether it counts: only groups
dense solves at >= ``--min-dense`` (0.8) enter each variant's ``accuracy``; the others are listed in ``dropped``.
The JSON holds every task's answer and continuation per variant, the engine's fetch counters and the provenance.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import time

import torch

from oasis_core import provenance
from oasis_core.modes import get as get_mode

from . import longtasks as LT
from .drafts import NGRAM_MIN_MATCH
from .endtoend import (
    HEAD_DRAFTS,
    Task,
    Variant,
    _is_reference,
    add_draft_head_arg,
    add_gate_arg,
    add_scorer_args,
    draft_head_kind,
    exec_config,
    run_engine,
    variants,
)

SCHEMA = "oasiskv-quality-tasks"
MODES = ("dense", "proxy", "lookahead", "retrieval")


def to_engine_tasks(tasks, filler) -> list:
    return [Task(t.kind, t.name, t.prompt(filler), t.answer_tokens, info={"group": t.group}) for t in tasks]


def run_variant(dec, v: Variant, n: int, tasks, filler, *, max_lanes: int, refs: dict, cfg_base: dict) -> tuple:
    """One variant over every task of one context length, ``max_lanes`` requests an engine -> (outputs {name:
    tokens}, counters)."""
    outs, fetched, missing, rows, steps, wall = {}, 0, 0, 0, 0, 0.0
    k = None
    for i in range(0, len(tasks), max_lanes):
        ts = to_engine_tasks(tasks[i : i + max_lanes], filler)
        cfg = exec_config(v, n, ts, shape=dec.shape, **cfg_base)
        drafts = get_mode(v.mode).drafts
        if drafts and v.draft not in HEAD_DRAFTS:  # oracle / n-gram stand in for a single-key head's proposals
            cfg = dataclasses.replace(cfg, draft_path=None, draft_head="single")
        raw = run_engine(dec, cfg, ts, v.draft, refs)
        for name, r in raw["tasks"].items():
            outs[name] = r["tokens_out"]
        fetched += raw["units_fetched"]
        missing += raw["missing"]
        rows += raw["decode_items"] * raw["rows_per_item"]
        steps += raw["decode_steps"]
        wall += raw["wall_s"]
        k = raw["top_k"]
    return outs, {
        "top_k_blocks": k,
        "fetched_per_row_step": fetched / max(rows, 1),
        "missing_per_row_step": missing / max(rows, 1),
        "decode_steps": steps,
        "wall_s": round(wall, 1),
    }


def summarize(tasks, outs: dict, decode) -> dict:
    per = {}
    for t in tasks:
        text = decode(outs[t.name])
        per[t.name] = {"group": t.group, "answer": t.answer, "continuation": text, **LT.score(t.answer, text)}
    return {"tasks": per, "by_group": LT.accuracy_by_group(per, tasks)}


def counted(by_group_dense: dict, min_dense: float) -> tuple[list, list]:
    keep = [g for g, a in by_group_dense.items() if a >= min_dense]
    return keep, [g for g in by_group_dense if g not in keep]


def accuracy(res: dict, keep: list):
    xs = [r["correct"] for r in res["tasks"].values() if r["group"] in keep]
    return sum(xs) / len(xs) if xs else None


def run(dec, decode, suites: dict, filler, var_list, *, max_lanes, min_dense, cfg_base,
        on_result=None, time_budget_s=None) -> dict:  # fmt: skip
    if not var_list or not _is_reference(var_list[0].mode):
        raise ValueError("variants: dense must come first")
    rows, skipped, dense = [], [], {}
    t0 = time.perf_counter()
    for v in var_list:
        for n, tasks in suites.items():
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s and not _is_reference(v.mode):
                skipped.append({"variant": v.label, "n_tokens": n, "why": f"time budget {time_budget_s:g} s"})
                continue
            refs = {name: toks for name, toks in dense.get(n, {}).get("outs", {}).items()}
            outs, ctr = run_variant(dec, v, n, tasks, filler, max_lanes=max_lanes, refs=refs,
                                    cfg_base=cfg_base)  # fmt: skip
            res = summarize(tasks, outs, decode)
            if _is_reference(v.mode):
                dense[n] = {"outs": outs, "res": res}
            keep, drop = counted(dense[n]["res"]["by_group"], min_dense)
            row = {"n_tokens": n, "variant": v.label, **dataclasses.asdict(v), **ctr, "counted_groups": keep,
                   "dropped_groups": drop, "accuracy": accuracy(res, keep), "accuracy_all": accuracy(res, list(
                       res["by_group"])), "by_group": res["by_group"], "tasks": res["tasks"]}  # fmt: skip
            if not _is_reference(v.mode):
                d = dense[n]["outs"]
                row["same_as_dense"] = sum(outs[k] == d[k] for k in outs) / len(outs)
            rows.append(row)
            print(line(row), flush=True)
            if on_result is not None:
                on_result({"rows": rows, "skipped": skipped})
    return {"rows": rows, "skipped": skipped, "elapsed_s": round(time.perf_counter() - t0, 1)}


def line(r: dict) -> str:
    acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.2f}"
    same = f" same-as-dense {r['same_as_dense']:.2f}" if "same_as_dense" in r else ""
    return (f"{r['n_tokens']:>6} {r['variant']:<32} K={r['top_k_blocks']:<4} acc(counted {len(r['counted_groups'])}) "
            f"{acc:>5}  acc(all) {r['accuracy_all']:.2f}{same}  fetch/row {r['fetched_per_row_step']:.2f}  "
            f"{r['wall_s']:.0f} s  " + " ".join(f"{g}={a:.2f}" for g, a in r["by_group"].items()))  # fmt: skip


def _decoder_fn(kind: str, path: str):
    if kind == "hf":
        from .texts import hf_tokenizer

        tok = hf_tokenizer(path)
        return lambda ids: tok.decode(ids, skip_special_tokens=True)
    from oasis_exec.server.tokenizer import load_tokenizer

    tok = load_tokenizer(path)
    return tok.decode


def add_command(sub) -> None:
    p = sub.add_parser("tasks", help="long-context task accuracy (passkey, multi-key, variable tracking) per mode")
    p.add_argument("--model-path", default=None, help="default: the SmolLM2 GGUF")
    p.add_argument("--tasks-file", default=None, help="a task file (longtasks.save_tasks); default: build here")
    p.add_argument("--make-tasks", default=None, metavar="FILE", help="only build the tasks and write this file")
    p.add_argument("--lengths", nargs="+", type=int, default=[2048])
    p.add_argument("--kinds", nargs="+", default=list(LT.KINDS), choices=LT.KINDS)
    p.add_argument("--depths", nargs="+", type=float, default=list(LT.DEPTHS))
    p.add_argument("--trials", type=int, default=5, help="tasks per group (passkey depth, multikey, vartrack)")
    p.add_argument("--answer-tokens", type=int, default=12)
    p.add_argument("--n-keys", type=int, default=4)
    p.add_argument("--hops", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--top-k", type=int, default=None, help="K in blocks (else --k-fracs of each length's blocks)")
    p.add_argument("--k-fracs", nargs="+", type=float, default=[0.125])
    p.add_argument("--fetch-ratios", nargs="+", type=float, default=[0.05])
    p.add_argument(
        "--drafts",
        nargs="+",
        default=["head"],
        choices=(*HEAD_DRAFTS, "oracle", "ngram"),
        help=f"head_ngram: the head with the engine's prompt lookup beside it (draft_ngram {NGRAM_MIN_MATCH})",
    )
    p.add_argument("--draft-path", default=None, help="the draft head directory (default: random weights)")
    add_draft_head_arg(p)
    add_scorer_args(p)
    add_gate_arg(p)
    p.add_argument("--min-dense", type=float, default=0.8, help="count a group only where dense solves this share")
    p.add_argument("--max-lanes", type=int, default=8, help="requests an engine")
    p.add_argument("--tokenizer", default="gguf", choices=("gguf", "hf"), help="decodes the continuations")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"))
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--no-cuda-graph", action="store_true")
    p.add_argument("--time-budget-s", type=float, default=None)
    p.add_argument("--commit", default=None)
    p.add_argument("--out", default=None)
    p.set_defaults(func=main)


def make_tasks_file(args, path: str) -> str:
    from oasis_exec.model.gguf import sha256_file

    from .texts import hf_tokenizer

    tok = hf_tokenizer(path)
    filler = LT.filler_ids(tok)
    suites = {n: LT.build_suite(tok, n, kinds=args.kinds, depths=args.depths, trials=args.trials,
                                answer_tokens=args.answer_tokens, seed=args.seed, n_keys=args.n_keys, hops=args.hops,
                                filler=filler) for n in args.lengths}  # fmt: skip
    meta = {"model_file": os.path.basename(path), "model_sha256": sha256_file(path), "seed": args.seed,
            "trials": args.trials, "texts": list(LT.TEXTS), "tokenizer": "transformers (from the GGUF)",
            "made": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}  # fmt: skip
    LT.save_tasks(args.make_tasks, filler, suites, meta)
    return args.make_tasks


def check_args(args) -> None:
    """Every bound before anything is loaded (ValueError: the command's one error line, exit 2)."""

    def bad(flag, why):
        raise ValueError(f"{flag}: {why}")

    if any(n < 256 for n in args.lengths):
        bad("--lengths", f"each must be >= 256 tokens, got {' '.join(map(str, args.lengths))}")
    if not 1 <= args.trials <= 1000:
        bad("--trials", f"must be in 1..1000, got {args.trials}")
    if not 1 <= args.answer_tokens <= 64:
        bad("--answer-tokens", f"must be in 1..64, got {args.answer_tokens}")
    if not (2 <= args.n_keys <= len(LT.NAMES) and 1 <= args.hops <= 16):
        bad("--n-keys/--hops", f"want 2..{len(LT.NAMES)} keys and 1..16 hops, got {args.n_keys} and {args.hops}")
    if not all(0 <= d <= 1 for d in args.depths):
        bad("--depths", "each must be in [0, 1]")
    if not all(0 < r <= 1 for r in args.fetch_ratios) or not all(0 < f <= 1 for f in args.k_fracs):
        bad("--fetch-ratios/--k-fracs", "each must be in (0, 1]")
    if args.top_k is not None and args.top_k < 1:
        bad("--top-k", f"must be >= 1, got {args.top_k}")
    if not 0 <= args.min_dense <= 1:
        bad("--min-dense", f"must be in [0, 1], got {args.min_dense}")
    if args.max_lanes < 1 or args.block_size < 1 or args.prefill_chunk < 1:
        bad("--max-lanes/--block-size/--prefill-chunk", "each must be >= 1")
    if args.time_budget_s is not None and not args.time_budget_s >= 0:
        bad("--time-budget-s", f"must be >= 0, got {args.time_budget_s}")
    if not all(0 <= g <= 1 for g in args.draft_gates):
        bad("--draft-gates", f"each must be in [0, 1], got {' '.join(map(str, args.draft_gates))}")
    if args.token_basis is not None and not os.path.isfile(args.token_basis):
        bad("--token-basis", f"no such file: {args.token_basis}")
    if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
        bad("--device", f"cpu or cuda, got {args.device!r}")
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        bad("--device", "CUDA is not available here")


def main(args) -> int:
    from oasis_exec.model.decoder import Decoder
    from oasis_exec.model.gguf import sha256_file

    check_args(args)
    path = args.model_path
    if path is None:
        from oasis_exec.model.gguf import smollm2_path

        path = smollm2_path()
    if args.make_tasks:
        print("wrote", make_tasks_file(args, path))
        return 0
    sha = None
    if args.tasks_file:
        filler, suites, tmeta = LT.load_tasks(args.tasks_file)
        sha = sha256_file(path) if os.path.isfile(path) else None
        suites = {n: [t for t in ts if t.kind in args.kinds] for n, ts in suites.items() if n in args.lengths}
        if not any(suites.values()):
            raise ValueError(f"--tasks-file {args.tasks_file}: no task of --lengths {args.lengths} and --kinds in it")
        if tmeta.get("model_sha256") and sha and tmeta["model_sha256"] != sha:
            raise ValueError(f"--tasks-file {args.tasks_file}: made for {tmeta.get('model_file')} (sha256 "
                             f"{tmeta['model_sha256'][:12]}...), not this model ({sha[:12]}...): its token ids "
                             "differ")  # fmt: skip
    dtype = args.dtype or ("bfloat16" if str(args.device).startswith("cuda") else "float32")
    t0 = time.time()
    dec = Decoder.from_path(path, dtype=getattr(torch, dtype), device=torch.device(args.device),
                            fused=str(args.device).startswith("cuda"))  # fmt: skip
    sha = sha or (sha256_file(path) if os.path.isfile(path) else None)
    if not args.tasks_file:
        from .texts import hf_tokenizer

        tok = hf_tokenizer(path)
        filler = LT.filler_ids(tok)
        suites = {n: LT.build_suite(tok, n, kinds=args.kinds, depths=args.depths, trials=args.trials,
                                    answer_tokens=args.answer_tokens, seed=args.seed, n_keys=args.n_keys,
                                    hops=args.hops, filler=filler) for n in args.lengths}  # fmt: skip
        tmeta = {"tokenizer": "transformers (from the GGUF), built in this run"}
    decode = _decoder_fn(args.tokenizer, path)
    modes = args.modes if any(map(_is_reference, args.modes)) else ["dense"] + list(args.modes)
    var_list = variants(modes, args.k_fracs, args.fetch_ratios, args.drafts, args.top_k, block_scores=args.block_scores,
                        draft_gates=args.draft_gates)  # fmt: skip
    cfg_base = dict(model_path=path, device=args.device, dtype=dtype, block_size=args.block_size, seed=args.seed,
                    draft_path=args.draft_path, cuda_graph=not args.no_cuda_graph,
                    prefill_chunk=args.prefill_chunk, token_basis=args.token_basis,
                    token_rank=args.token_rank, draft_head=draft_head_kind(args))  # fmt: skip
    out = args.out or os.path.join("experiments", "long_context_draft", "results", "tasks.json")

    meta = {
        "schema": SCHEMA, "version": 1,
        "what": "long-context task accuracy per mode through the engine; a group counts where dense solves it at "
        f">= {args.min_dense:g}",
        "weights": {"source": "real", "file": os.path.basename(path),
                    "sha256": sha, "model": dec.shape.name},
        "draft": {"drafts": args.drafts, "path": args.draft_path, "draft_head": cfg_base["draft_head"],
                  "weights": "trained" if args.draft_path else "random (no lookahead signal expected)"},
        "selection": "model (the engine's own)", "block_scores": args.block_scores, "token_basis": args.token_basis,
        "token_rank": args.token_rank, "device": args.device + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""),
        "dtype": dtype, "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": args.commit or provenance.commit(dirty_paths=("oasis_exec", "oasis_core")),
        "command": "python -m oasis_exec quality tasks " + " ".join(sys.argv[sys.argv.index("tasks") + 1 :])
        if "tasks" in sys.argv else None,
        "tasks": {"file": args.tasks_file, **tmeta, "per_length": {str(n): len(ts) for n, ts in suites.items()},
                  "groups": sorted({t.group for ts in suites.values() for t in ts})},
        "min_dense": args.min_dense, "max_lanes": args.max_lanes, "load_s": round(time.time() - t0, 1),
    }  # fmt: skip

    def write(doc):
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out + ".tmp", "w") as fh:
            json.dump({**meta, **doc}, fh, indent=1)
        os.replace(out + ".tmp", out)

    doc = run(dec, decode, suites, filler, var_list, max_lanes=args.max_lanes, min_dense=args.min_dense,
              cfg_base=cfg_base, on_result=write,
              time_budget_s=args.time_budget_s)  # fmt: skip
    write(doc)
    print("wrote", out)
    return 0
