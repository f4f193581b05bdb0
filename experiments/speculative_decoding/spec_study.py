"""Speculative decoding on the real model: accepted tokens a step, tok/s and TPOT against k = 0, per mode and context.

    python experiments/speculative_decoding/spec_study.py [--device cpu|cuda] [--dtype float32|bfloat16]
        [--modes dense lookahead] [--contexts 4096 7936] [--ks 0 1 2 3 auto] [--concurrency 2] [--steps 12]
        [--warmup 3] [--top-k 64] [--text traces/texts/argparse.py.txt] [--model-path GGUF] [--draft-path DIR]
        [--draft-head single|attn]
        [--engine-per-k] [--fresh-k0 CONTEXT ...] [--chained-k0 N] [--eager-k0] [--out results/spec_cpu.jsonl]
        [--table results/spec_cpu.md]
    python experiments/speculative_decoding/spec_study.py --table-only results/spec_cpu.jsonl [--table FILE]

Every (mode, context) runs ``concurrency`` requests cut from one real text (``--text``), prefilled for real, then
decodes them greedily with each draft length of ``--ks`` (``auto`` is ``auto:N``, N the longest integer of
``--ks``), ``--warmup`` untimed and ``--steps`` timed steps each. By default all the k of a (mode, context) share
one engine and one prefill (``oasis_exec.tools.bench.run_bench_phases``: on the CPU a real 8K prefill costs minutes, the
steps seconds); their contexts grow by the earlier phases' tokens (at most 14 × (warmup + steps) tokens). In that
engine a ``dense`` k = 0 phase still runs the draft head's proposal each step; ``--fresh-k0 CONTEXT`` adds, at those
contexts, a k = 0 run of an engine of its own (``dense`` then has no draft head at all), the plain non-speculative
baseline. ``--engine-per-k`` builds one engine per k instead (the GPU, where the prefill is cheap).
``--chained-k0 N`` adds, in every (mode, context), a k = 0 run of an engine of its own with decode chains of N steps
(``ExecConfig.decode_chain``; the other runs are unchained): the ordinary
engine's own best step, the strictest baseline for "speculation against none", and the table's k = 0 reference
where it is there. ``--eager-k0`` adds a k = 0 run with CUDA graphs off (greedy speculative steps run as graphs too since 2026-12-01
evening; before, they ran eagerly, and this was their like-for-like baseline; on the CPU there are no graphs, so it
is the same as k = 0 and is not run there). ``--spec-chain N`` adds every fixed k > 0 on an engine of its own with
its speculative steps chained N at a time (``ExecConfig.spec_chain``, run ``spec-chained``).

Each record is the bench's (``oasis_exec.tools.bench``) plus ``weights`` (real), ``run`` (phase | fresh | chained |
spec-chained | engine | eager) and the study's arguments; the table (markdown) has, per mode and context, the tokens a request emits per
step, tok/s (emitted tokens), the step time p50, the TPOT (mean step time / tokens a step) and both against k = 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core import provenance  # noqa: E402

DRAFT = os.path.join(REPO, "experiments", "trained_draft_head", "smollm2-eagle3")
TEXT = os.path.join(REPO, "traces", "texts", "argparse.py.txt")
BLOCK = 16  # the study's block size (tokens a KV block)


def phase_values(ks) -> list:
    """``--ks`` as speculative_k values: ints, and ``auto`` as ``auto:N`` (N the longest int; 3 without one)."""
    longest = max([int(k) for k in ks if k.isdigit()] or [3])
    return [int(k) if k.isdigit() else (f"auto:{longest}" if k == "auto" else k) for k in ks]


def longest(values) -> int:
    from oasis_core.speculation import parse_spec

    return max(parse_spec(v)[0] for v in values)


def draft_head_of(a) -> str:
    """``--draft-head``, else the kind ``--draft-path``'s ``config.json`` names (an attention head, e.g. Gemma's
    ``experiments/long_context_draft/heads/gemma-attn-32k``, speculates at k = 1 only: ``--ks 0 1``)."""
    if getattr(a, "draft_head", None):
        return a.draft_head
    if not a.draft_path:
        return "single"
    from oasis_exec.model.draft_attn import saved_kind

    return saved_kind(a.draft_path)


def base_config(a, mode, context, k_max):
    from oasis_exec.config import ExecConfig

    out = 14 * (a.warmup + a.steps) + 1  # the most tokens the phases emit (k <= 3: 1+2+3+4+4 a step)
    chain = getattr(a, "spec_chain", 0)
    if chain > 1 and k_max:  # the spec-chained run: (k + 1) tokens a step, at most BLOCK // (k + 1) steps a chain
        out = max(out, (a.warmup + a.steps + 1) * (k_max + 1) * min(chain, BLOCK // (k_max + 1)))
    return ExecConfig(
        model_path=a.model_path,
        draft_path=a.draft_path,
        draft_head=draft_head_of(a),
        device=a.device,
        dtype=a.dtype,
        mode=mode,
        top_k=a.top_k,
        block_size=BLOCK,
        max_lanes=a.concurrency,
        max_context=context + max(out, (a.warmup + a.steps + 1) * (k_max + 1)) + 32,
        speculative_k=k_max,
        prefill_interleave=False,
        decode_chain=1,  # k = 0 phases: the single graphed step the speculative results were measured against
        spec_chain=1,  # likewise one speculative step a call (--spec-chain adds the chained run)
        spec_predict=getattr(a, "spec_predict", "after"),
        kv_budget_gb=getattr(a, "kv_budget_gb", None),
        # one scorer for after and beside (block_score=auto would give a real SmolLM2 tokens under after and
        # minmax_sum+sink under beside, which cannot run tokens): the results' scorer before auto existed
        block_score=getattr(a, "block_score", "minmax_sum+sink"),
        **({} if getattr(a, "draft_ngram", None) is None else {"draft_ngram": a.draft_ngram}),
    )


def run(a) -> list:
    import torch

    from oasis_exec.__main__ import _prompt_tokens
    from oasis_exec.model.decoder import Decoder
    from oasis_exec.tools.bench import run_bench, run_bench_phases

    toks = _prompt_tokens(a.text, a.model_path, "--text")
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    dec = Decoder.from_path(a.model_path, dtype, torch.device(a.device), a.device.startswith("cuda"))  # once
    name = a.text if ".npz:" in a.text else os.path.relpath(a.text, REPO)
    values = phase_values(a.ks)
    k_max = longest(values)
    extra = {"weights": "real", "dtype": a.dtype, "study": "speculative_decoding", "study_commit": provenance.commit()}
    for context in a.contexts:  # refused up front, not after the earlier contexts have run
        need = base_config(a, "dense", context, k_max).max_context
        if need > dec.shape.max_context_tokens:
            room = need - context
            raise SystemExit(
                f"spec_study: context {context} + {room} tokens of decode room exceed the model's "
                f"{dec.shape.max_context_tokens} positions; the longest context here is "
                f"{dec.shape.max_context_tokens - room}"
            )
    recs = []

    def keep(rec, how):
        rec = dict(rec, run=how, **extra)
        recs.append(rec)
        with open(a.out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(
            f"{rec['mode']:9s} ctx={rec['context']} k={rec['speculative_k']!s:6s} {how:6s} "
            f"acc/step={rec['accepted_tokens_per_step']:.3f} tok/s={rec['throughput_tok_s']:.2f} "
            f"step p50={rec['tpot_ms_p50']:.1f} ms hist={rec['accepted_hist']} prefill={rec['prefill_s']:.0f}s",
            flush=True,
        )

    for context in a.contexts:
        for mode in a.modes:
            cfg = base_config(a, mode, context, k_max)
            t0 = time.perf_counter()
            if a.engine_per_k:
                for v in values:
                    c = dataclasses.replace(cfg, speculative_k=v)
                    keep(run_bench(c, context, a.concurrency, a.steps, a.warmup, True, toks, name, dec), "engine")
            else:
                for rec in run_bench_phases(
                    cfg, context, a.concurrency, a.steps, a.warmup, values, toks, name, decoder=dec
                ):
                    keep(rec, "phase")
            if context in a.fresh_k0 and mode in a.fresh_k0_modes and not a.engine_per_k:
                c = dataclasses.replace(cfg, speculative_k=0)
                keep(run_bench(c, context, a.concurrency, a.steps, a.warmup, True, toks, name, dec), "fresh")
            if a.chained_k0 > 1 and not a.engine_per_k:
                c = dataclasses.replace(cfg, speculative_k=0, decode_chain=a.chained_k0)
                keep(run_bench(c, context, a.concurrency, a.steps, a.warmup, True, toks, name, dec), "chained")
            for v in values if a.spec_chain > 1 and not a.engine_per_k else ():
                if isinstance(v, int) and v > 0:  # speculative steps chained (ExecConfig.spec_chain)
                    c = dataclasses.replace(cfg, speculative_k=v, spec_chain=a.spec_chain)
                    keep(run_bench(c, context, a.concurrency, a.steps, a.warmup, True, toks, name, dec), "spec-chained")
            if a.eager_k0 and a.device != "cpu":
                c = dataclasses.replace(cfg, speculative_k=0, cuda_graph=False)
                keep(run_bench(c, context, a.concurrency, a.steps, a.warmup, True, toks, name, dec), "eager")
            print(f"# {mode} {context}: {time.perf_counter() - t0:.0f} s", flush=True)
    return recs


def _short(path: str) -> str:
    """A draft path from ``experiments/`` on (the records keep the path the run had)."""
    i = path.find("experiments/")
    return path[i:] if i >= 0 else path


def _k_sort(k):
    return (1, 0) if isinstance(k, str) else (0, k)


def _tpot(r) -> float:
    """A record's mean time a token a request: its mean step (a chain's, a speculative step's) over the tokens a
    request emits in it. Records without ``step_ms_mean`` (before 5625de3, 2026-12-02) are read as the tables of then
    read them: ``tpot_ms_mean`` over the tokens a step."""
    step = r.get("step_ms_mean", r["tpot_ms_mean"])
    return step / r["accepted_tokens_per_step"]


def table(recs) -> str:
    """The markdown table of ``recs``: per (mode, context), a row a run, against that group's k = 0 run (a chained
    engine's where there is one, else a fresh engine's, else the first k = 0 run)."""
    if not recs:
        return "(no records)\n"
    r0 = recs[0]
    dates = sorted({r["date"][:10] for r in recs})
    head = (
        f"Weights: {r0.get('weights', 'real' if not r0.get('dummy_weights') else 'dummy')} "
        f"({os.path.basename(str(r0['model']))}), draft: {_short(next((r['draft'] for r in recs if r.get('draft')), ''))}, "
        "selection source: "
        f"{', '.join(sorted({r['selection'] for r in recs}))}, acceptance: "
        f"{', '.join(sorted({str(r.get('acceptance') or 'model') for r in recs if r['speculative_k']}))}, "
        f"device: {r0['device']} {r0.get('dtype', '')}, "
        f"date: {', '.join(dates)}, commit: {', '.join(sorted({r['commit'] for r in recs}))}; "
        f"prompt: {r0['prefill']}, concurrency {r0['concurrency']}, top_k {r0['top_k']} (+ local block), "
        f"{r0['steps']} timed steps after {r0['warmup']} warm-up steps a run.\n\n"
        "tokens/step: tokens a request emits a step (accepted drafts + the target's); step: the step's wall time "
        "p50; TPOT: mean step time / tokens a step; vs k=0: tok/s and TPOT against the group's k = 0 run with "
        "decode chains (`chained`, an engine of its own) where there is one, else of an engine of its own "
        "(`fresh`), else its first k = 0 run (`phase`: the engine shared by "
        "the group's k, whose dense k = 0 still runs the draft head's proposal every step; `engine`: one engine "
        "a k; `eager`: CUDA graphs off).\n\n"
    )
    rows = [
        "| mode | context | k | run | tokens/step | accepted hist | tok/s | step p50 ms | TPOT ms | tok/s vs k=0 | "
        "TPOT vs k=0 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    groups = {}
    for r in recs:
        groups.setdefault((r["mode"], r["context"]), []).append(r)
    for (mode, ctx), rs in sorted(groups.items()):
        base = [r for r in rs if r["speculative_k"] == 0]
        runs = {r.get("run"): r for r in reversed(base)}  # the first of each kind
        b = runs.get("chained") or runs.get("fresh") or (base[0] if base else None)
        order = {"phase": 0, "engine": 0, "fresh": 1, "chained": 2, "eager": 3}
        for r in sorted(rs, key=lambda r: (_k_sort(r["speculative_k"]), order.get(r.get("run"), 4))):
            tpot = _tpot(r)
            vs = "" if b is None else f"{r['throughput_tok_s'] / b['throughput_tok_s']:.2f}×"
            vt = "" if b is None else f"{tpot / _tpot(b):.2f}×"
            rows.append(
                f"| {mode} | {ctx} | {r['speculative_k']} | {r.get('run', '')}"
                f"{' (beside)' if r['speculative_k'] and r.get('spec_predict') == 'beside' else ''} | "
                f"{r['accepted_tokens_per_step']:.2f} | {json.dumps(r['accepted_hist']) if r['accepted_hist'] else ''} | "
                f"{r['throughput_tok_s']:.2f} | {r.get('step_ms_p50', r['tpot_ms_p50']):.1f} | {tpot:.1f} | {vs} | "
                f"{vt} |"
            )
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default: float32 on the CPU, bfloat16 on CUDA")
    ap.add_argument("--modes", nargs="+", default=["dense", "lookahead"])
    ap.add_argument("--contexts", nargs="+", type=int, default=[4096, 7936])
    ap.add_argument("--ks", nargs="+", default=["0", "1", "2", "3", "auto"])
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--text", default=TEXT, help="a text file (the model tokenizes it) or token ids FILE.npz:KEY[:ROW]")
    ap.add_argument("--model-path", default=os.environ.get("OASIS_GGUF"))
    ap.add_argument("--draft-path", default=DRAFT)
    ap.add_argument(
        "--draft-head",
        default=None,
        choices=("single", "attn"),
        help="ExecConfig.draft_head (default: the kind --draft-path's config.json names); attn: --ks 0 1 (or auto) only",
    )
    ap.add_argument("--engine-per-k", action="store_true", help="one engine (and prefill) per k")
    ap.add_argument("--fresh-k0", nargs="*", type=int, default=[], help="contexts with a k=0 run of its own engine")
    ap.add_argument(
        "--fresh-k0-modes",
        nargs="+",
        default=["dense"],
        help="modes of --fresh-k0 (default dense: lookahead drafts at k = 0 anyway, so its phase k=0 is the same)",
    )
    ap.add_argument("--spec-predict", default="after", choices=("after", "beside"), help="ExecConfig.spec_predict")
    ap.add_argument(
        "--draft-ngram",
        type=int,
        default=None,
        help="ExecConfig.draft_ngram: prompt lookup's token as the draft where the last N tokens occurred before "
        "(default: the config's, ExecConfig.draft_ngram)",
    )
    ap.add_argument("--kv-budget-gb", type=float, default=None, help="ExecConfig.kv_budget_gb (lanes clip to it)")
    ap.add_argument(
        "--block-score",
        default="minmax_sum+sink",
        help="ExecConfig.block_score, the same for every run (auto would differ between after and beside)",
    )
    ap.add_argument(
        "--chained-k0",
        type=int,
        default=0,
        metavar="N",
        help="also k=0 on an engine of its own with decode chains of N steps (the table's baseline then)",
    )
    ap.add_argument(
        "--spec-chain",
        type=int,
        default=0,
        help="also every fixed k > 0 on an engine of its own with speculative steps chained N at a time "
        "(ExecConfig.spec_chain; run 'spec-chained')",
    )
    ap.add_argument("--eager-k0", action="store_true", help="also k=0 with CUDA graphs off (not on the CPU)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "spec_cpu.jsonl"))
    ap.add_argument("--table", default=None, help="markdown table of every record in --out (default: --out with .md)")
    ap.add_argument("--table-only", default=None, metavar="JSONL", help="only write the table of these records")
    a = ap.parse_args(argv)
    if a.table_only:
        recs = [json.loads(line) for line in open(a.table_only) if line.strip()]
        md = a.table or os.path.splitext(a.table_only)[0] + ".md"
    else:
        if a.model_path is None:
            from oasis_exec.model.gguf import smollm2_path

            a.model_path = smollm2_path()
        a.dtype = a.dtype or ("float32" if a.device == "cpu" else "bfloat16")
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        run(a)  # appends its records to --out
        # the table of every record in --out: a device step's groups (spec_rows.sh) call this once a group
        recs = [json.loads(line) for line in open(a.out) if line.strip()]
        md = a.table or os.path.splitext(a.out)[0] + ".md"
    with open(md, "w") as fh:
        fh.write(f"# Speculative decoding, real model ({datetime.date.today().isoformat()})\n\n" + table(recs))
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
