"""Issue 5 item 1: the two transfer paths compared inside the real decode step, and the engine's choice table.

    python experiments/transfer_paths/transfer_paths.py --out FILE.jsonl [--concurrency 64,32,8] [--programs 4,8,16,32]
        [--threads 8,16] [--steps 12] [--warmup 3] [--budget-s 480] [--dry-run]
    python experiments/transfer_paths/transfer_paths.py --summarize FILE.jsonl OUT_PREFIX [--table-out PATH]

Run mode, in ONE process (lookahead, 16K context, synthetic selection, fetch ratio 0.05, Qwen3-8B shape, dummy
weights, ``--kv-budget-gb`` 52, ``max_lanes`` = concurrency, host pool sized per concurrency like
``h200_headline.host_gb``): for each concurrency, ``oasis_exec.tools.bench.run_bench`` of

- ``c{n}-notransfer-graph``: the step without the copies, CUDA graphs (the reference of the UVA runs);
- ``c{n}-uva{p}-graph``: the UVA gather on ``p`` programs, CUDA graphs, for each ``--programs`` (the copies in a
  graph of their own, ``copy_graph``; ``--in-graph`` adds ``c{n}-uva{p}-ig-graph`` with them inside the step's);
- ``c{n}-notransfer-eager``: the step without the copies, eager (the reference of the eager host path);
- ``c{n}-host{t}-graph``: the host-threaded gather into pinned staging + one DMA, ``t`` threads, in CUDA graphs
  (external events hand the copy list to the worker and its copies back: ``oasis_exec.workingset.prefetcher``);
- ``c{n}-host{t}-eager``: the same path run eagerly;
- then, for each transferring configuration, ``...-profile``: the same eager with ``profile=True`` (per-stage CUDA
  events), for the copy time per step, its GB/s and the stall-based hidden fraction.

Order: the TPOT runs of every concurrency first (largest concurrency first), then the profiled runs (largest first).
The first run pins the largest host pool; ``oasis_exec.kv.store.pinned_pieces`` keeps the registered pieces and
hands later, smaller pools slices of them, so pinning (~0.4 s/GB) happens once. One JSON line per run appended to
``--out``: the bench record plus ``label``, ``n`` (target concurrency), ``config`` (``notransfer`` / ``uva{p}`` /
``host{t}``), ``exec`` (graph / eager), ``role`` (reference / transfer / profile) and ``status``; a failed run
writes ``{"label", "status": "error", "error", ...}`` and the script goes on. Labels already in ``--out`` are
skipped (``--retry-errors``: except those that failed), so a rerun resumes. ``--budget-s``: no new run starts once
it is spent. Timestamped progress lines on stdout.

Summarize mode writes ``OUT_PREFIX.md`` (per concurrency: config, TPOT p50, throughput, exposed ms = TPOT - the
matching no-transfer TPOT (graph or eager, as the run), copy ms per step and GB/s from the profiled run, hidden
fraction = 1 - exposed / copy ms clipped to [0, 1]; the winner = lowest TPOT p50 among the transferring configs,
the experimental ``-tma`` ones excepted)
and the engine's choice table ``OUT_PREFIX_table.json`` (or ``--table-out``) in the format of
``oasis_exec/transfer/table.json``, which ``oasis_exec.transfer.choice`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

BS = 16
PIN_S_PER_GB = 0.4  # cudaHostRegister of fresh pages (issue 5 note); pinned once, for the largest pool


def ints(s: str) -> list:
    return [int(x) for x in s.split(",") if x.strip()]


def host_gb(n: int, context: int, steps: int, warmup: int, unit: int) -> float:
    """Pinned pool for ``n`` requests (as ``h200_headline.host_gb``): their blocks + 1 each, GB."""
    blocks = -(-(context + steps + warmup) // BS)
    return round(n * (blocks + 1) * unit / 1e9 + 0.01, 3)


def plan(a) -> list:
    """[(label, n, config, exec, role, ExecConfig overrides)]: TPOT runs of every concurrency, then profiled runs.
    A config is ``uva{p}`` / ``host{t}``, with ``-hi`` appended for side streams at high priority and, with
    ``--in-graph``, ``-ig`` for UVA copies inside the step's graph (``copy_graph="off"``; else ``"on"``)."""
    tpot, prof = [], []

    def add(n, conf, eager_tpot, kw):
        for prio in a.priorities:
            c = conf + ("-hi" if prio == "high" else "")
            kw2 = dict(kw, stream_priority=prio)
            cg = {} if eager_tpot else {"copy_graph": "on"}  # UVA: its copies as a graph of their own
            tpot.append((f"c{n}-{c}-graph", n, c, "graph", "transfer", dict(kw2, cuda_graph=True, **cg)))
            if not eager_tpot and a.in_graph:  # UVA: also with the copies inside the step's graph
                tpot.append(
                    (
                        f"c{n}-{c}-ig-graph",
                        n,
                        c + "-ig",
                        "graph",
                        "transfer",
                        dict(kw2, cuda_graph=True, copy_graph="off"),
                    )
                )
            if eager_tpot:  # the host path eager too (its graph mode is new); UVA's would repeat its profiled run
                tpot.append((f"c{n}-{c}-eager", n, c, "eager", "transfer", dict(kw2, cuda_graph=False)))
            prof.append((f"c{n}-{c}-profile", n, c, "eager", "profile", dict(kw2, cuda_graph=False, profile=True)))

    for n in a.concurrency:
        tpot.append(
            (
                f"c{n}-notransfer-graph",
                n,
                "notransfer",
                "graph",
                "reference",
                dict(transfer="uva", no_transfer=True, cuda_graph=True),
            )
        )
        for p in a.programs:
            for kern in a.uva_kernels:  # tma: the experimental TMA gather (config uva{p}-tma)
                add(
                    n,
                    f"uva{p}" + ("-tma" if kern == "tma" else ""),
                    False,
                    dict(transfer="uva", uva_programs=p, uva_kernel=kern),
                )
        tpot.append(
            (
                f"c{n}-notransfer-eager",
                n,
                "notransfer",
                "eager",
                "reference",
                dict(transfer="uva", no_transfer=True, cuda_graph=False),
            )
        )
        for t in a.threads:
            for kern in a.host_kernels:  # native: the C gather (config host{t}-nat)
                for sw in a.switch_us:  # > 0: Python's switch interval in microseconds for the run (-sw{us})
                    conf = f"host{t}" + ("-nat" if kern == "native" else "") + (f"-sw{sw}" if sw else "")
                    add(
                        n,
                        conf,
                        True,
                        dict(transfer="host", host_threads=t, host_kernel=kern, **({"_switch_us": sw} if sw else {})),
                    )
    return tpot + prof


def est_s(role: str, ex: str, n: int) -> float:
    """Rough seconds of one run once the pool is pinned (engine build, graph capture, 15 steps)."""
    base = 2.0 if ex == "graph" else 1.5 + 0.03 * n  # eager steps: ~100-250 ms at 16-64 requests
    return base * (1.5 if role == "profile" else 1.0)


def load_done(path: str, retry_errors: bool) -> set:
    from experiments.common.reporting import read_jsonl

    return {
        r["label"] for r in read_jsonl(path) if "label" in r and (r.get("status", "ok") == "ok" or not retry_errors)
    }


def run(a) -> int:
    from oasis_core.specs import get_model

    m = get_model(a.model)
    unit = m.n_layers * m.n_kv_heads * BS * m.head_dim * 2 * 2  # one host block: every layer and KV head, K and V
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - t0:5.0f}s] {msg}", flush=True)

    runs = plan(a)
    done = load_done(a.out, a.retry_errors)
    todo = [r for r in runs if r[0] not in done]
    pin_gb = max((host_gb(n, a.context, a.steps, a.warmup, unit) for _, n, *_ in todo), default=0.0)
    total = PIN_S_PER_GB * pin_gb * (a.device == "cuda") + sum(est_s(r[4], r[3], r[1]) for r in todo)
    for label, n, *_ in runs:
        log(
            f"plan {label:<24} n={n:3d} host_kv_gb={host_gb(n, a.context, a.steps, a.warmup, unit):7.2f}"
            f"{' (done)' if label in done else ''}"
        )
    log(
        f"{len(todo)} of {len(runs)} runs to do; pin {pin_gb:.1f} GB once (~{PIN_S_PER_GB * pin_gb:.0f} s on a GPU); "
        f"estimate ~{total:.0f} s plus CUDA init and Triton compiles; budget {a.budget_s:.0f} s"
    )
    if a.dry_run:
        return 0

    import gc

    import torch

    from oasis_exec.config import ExecConfig
    from oasis_exec.tools.bench import run_bench

    cuda = a.device == "cuda"
    for label, n, conf, ex, role, kw in todo:
        spent = time.perf_counter() - t0
        if spent > a.budget_s:
            log(f"budget spent ({spent:.0f} of {a.budget_s:.0f} s): not starting {label} and the rest")
            break
        gb = host_gb(n, a.context, a.steps, a.warmup, unit)
        meta = {"label": label, "n": n, "config": conf, "exec": ex, "role": role}
        log(f"start {label}")
        t1 = time.perf_counter()
        kw = dict(kw)
        sw = kw.pop("_switch_us", None)
        prev_sw = sys.getswitchinterval()
        if sw:
            sys.setswitchinterval(sw * 1e-6)
            meta["switch_interval_us"] = sw
        try:
            cfg = ExecConfig(
                model=a.model,
                device=a.device,
                dtype="bfloat16" if cuda else "float32",
                mode="lookahead",
                selection="synthetic",
                top_k=a.top_k,
                block_size=BS,
                fetch_ratio=a.fetch_ratio,
                max_context=a.context + a.warmup + a.steps + 2 * BS,
                kv_budget_gb=a.kv_budget_gb,
                host_kv_gb=gb,
                max_lanes=n,
                decode_chain=1,  # the paths' per-step cost, as the table was measured
                **kw,
            )
            rec = run_bench(cfg, a.context, n, a.steps, a.warmup, host_fill=False)
            rec.update(
                meta,
                status="ok",
                wall_s=round(time.perf_counter() - t1, 1),
                cuda_graph=cfg.cuda_graph,
                profile=cfg.profile,
                host_threads=cfg.host_threads if cfg.transfer == "host" else None,
                host_kernel=cfg.host_kernel if cfg.transfer == "host" else None,
            )
            if rec["concurrency"] < n:
                rec["status_note"] = f"admitted {rec['concurrency']} of {n}"
            st = rec.get("stage_ms_per_step") or {}
            gbs = rec.get("transfer_gb_s")
            log(
                f"done  {label}: n={rec['concurrency']} p50={rec['tpot_ms_p50']:.2f} ms "
                f"tok/s={rec['throughput_tok_s']:.1f} MB/step={rec['bytes_moved_per_step'] / 1e6:.1f}"
                + (f" copy={st['transfer']:.2f} ms/step {gbs:.1f} GB/s" if st.get("transfer") and gbs else "")
                + f" build={rec['build_s']:.1f} s wall={rec['wall_s']} s"
            )
        except Exception as e:  # one failed configuration must not lose the others
            rec = dict(
                meta,
                status="error",
                host_kv_gb=gb,
                wall_s=round(time.perf_counter() - t1, 1),
                error=" ".join(f"{type(e).__name__}: {e}".split())[:400],
            )
            log(f"FAIL  {label}: {rec['error']}")
        sys.setswitchinterval(prev_sw)
        d = os.path.dirname(a.out)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        gc.collect()
        if cuda and torch.cuda.is_available():
            torch.cuda.empty_cache()
    log("transfer paths done")
    return 0


# -- summarize ---------------------------------------------------------------------------------------------------


def _f(x, nd=2):
    return "–" if x is None else f"{x:,.{nd}f}"


def _pct(x):
    return "–" if x is None else f"{100 * x:.0f}%"


def summarize_records(recs: list) -> dict:
    """Per concurrency: rows (one per TPOT config, with the profiled run's copy figures) and the winner.

    Returns {n: {"rows": [...], "winner": row or None, "refs": {"graph": tpot, "eager": tpot}}}."""
    ok = [r for r in recs if r.get("status", "ok") == "ok" and "label" in r]
    by_n = defaultdict(list)
    for r in ok:
        by_n[r.get("n", r.get("concurrency"))].append(r)
    out = {}
    for n in sorted(by_n, reverse=True):
        rs = by_n[n]
        prof = {r["config"]: r for r in rs if r.get("role") == "profile"}
        refs = {r["exec"]: r["tpot_ms_p50"] for r in rs if r.get("role") == "reference"}
        rows = []
        for r in rs:
            if r.get("role") not in ("reference", "transfer"):
                continue
            conf, ex = r["config"], r["exec"]
            base = conf.split("-")[0]  # uva16 of uva16-hi
            row = {
                "label": r["label"],
                "config": conf,
                "exec": ex,
                "role": r["role"],
                "tpot_ms": r["tpot_ms_p50"],
                "throughput_tok_s": r["throughput_tok_s"],
                "admitted": r.get("concurrency"),
                "path": "host" if conf.startswith("host") else "uva" if conf.startswith("uva") else None,
                "stream_priority": r.get("stream_priority") or ("high" if "-hi" in conf else "normal"),
                "copy_graph": conf.startswith("uva") and not conf.endswith("-ig"),
                "uva_kernel": "tma" if "-tma" in conf else "loads" if conf.startswith("uva") else None,
                "uva_programs": r.get("uva_programs") if conf.startswith("uva") else None,
                "host_threads": r.get("host_threads") if conf.startswith("host") else None,
                "host_kernel": ("native" if "-nat" in conf else "torch") if conf.startswith("host") else None,
                "switch_us": r.get("switch_interval_us"),
                "exposed_ms": None,
                "copy_ms": None,
                "gb_s": None,
                "mb_step": None,
                "hidden": None,
                "hidden_profiled": None,
                "cpu_gather_ms": None,
            }
            if row["path"] == "uva" and row["uva_programs"] is None:
                row["uva_programs"] = int(base[3:])
            if row["path"] == "host" and row["host_threads"] is None:
                row["host_threads"] = int(base[4:])
            if r["role"] == "transfer":
                ref = refs.get(ex)
                if ref is not None:
                    row["exposed_ms"] = r["tpot_ms_p50"] - ref
                p = prof.get(conf, prof.get(conf.removesuffix("-ig")))  # eager profile: the same for -ig
                if p is not None:
                    st = p.get("stage_ms_per_step") or {}
                    row["copy_ms"] = st.get("transfer")
                    row["cpu_gather_ms"] = st.get("host_gather")
                    row["gb_s"] = p.get("transfer_gb_s")
                    row["hidden_profiled"] = p.get("hidden_fraction")
                    mb = p.get("bytes_moved_per_step")
                    row["mb_step"] = mb / 1e6 if mb is not None else None
                if row["mb_step"] is None and r.get("bytes_moved_per_step") is not None:
                    row["mb_step"] = r["bytes_moved_per_step"] / 1e6
                if row["exposed_ms"] is not None and row["copy_ms"]:
                    row["hidden"] = min(1.0, max(0.0, 1.0 - row["exposed_ms"] / row["copy_ms"]))
            rows.append(row)
        order = {"reference": 0, "transfer": 1}
        rows.sort(
            key=lambda w: (
                order[w["role"]],
                w["exec"] != "graph",
                w["path"] or "",
                w["uva_programs"] or 0,
                w["host_threads"] or 0,
                w["stream_priority"],
            )
        )
        # reported, not chosen (the engine's table has no field for them): the experimental TMA gather (-tma) and
        # runs under a changed switch interval (-sw)
        cands = [
            w
            for w in rows
            if w["role"] == "transfer" and w["tpot_ms"] is not None and w["uva_kernel"] != "tma" and not w["switch_us"]
        ]
        winner = min(cands, key=lambda w: w["tpot_ms"]) if cands else None
        out[n] = {"rows": rows, "winner": winner, "refs": refs}
    return out


def choice_table(summary: dict, recs: list, source: str) -> dict:
    ok = [r for r in recs if r.get("status", "ok") == "ok" and "label" in r]
    devices = sorted({r.get("device", "?") for r in ok})
    dates = sorted({str(r.get("date", "?"))[:10] for r in ok})
    commits = sorted({r.get("commit", "?") for r in ok})
    choices = []
    for n in sorted(summary):
        w = summary[n]["winner"]
        if w is None:
            continue
        ref = summary[n]["refs"].get(w["exec"])
        choices.append(
            {
                "concurrency": n,
                "path": w["path"],
                "uva_programs": w["uva_programs"],
                "host_threads": w["host_threads"],
                "stream_priority": w["stream_priority"],
                **({"host_kernel": w["host_kernel"]} if w["path"] == "host" else {}),
                "copy_graph": w["copy_graph"],
                "tpot_ms": round(w["tpot_ms"], 3),
                "no_transfer_tpot_ms": round(ref, 3) if ref is not None else None,
                "throughput_tok_s": round(w["throughput_tok_s"], 1),
                "label": w["label"],
                "exec": w["exec"],
            }
        )
    return {
        "source": f"{source}: experiments/transfer_paths/transfer_paths.py --summarize (per concurrency, the transferring "
        f"configuration with the lowest TPOT p50)",
        "device": ", ".join(devices),
        "date": " .. ".join([dates[0], dates[-1]] if len(dates) > 1 else dates),
        "commit": ", ".join(commits),
        "choices": choices,
    }


def summarize(inp: str, prefix: str, table_out: str | None = None) -> dict:
    from experiments.common.reporting import provenance, read_jsonl, write_markdown

    if not os.path.exists(inp):
        raise FileNotFoundError(inp)
    recs = read_jsonl(inp)
    src = os.path.relpath(os.path.abspath(inp), REPO)
    if src.startswith(".."):
        src = inp
    summary = summarize_records(recs)
    table = choice_table(summary, recs, src)
    errors = [r for r in recs if r.get("status") == "error"]
    ok = [r for r in recs if r.get("status", "ok") == "ok" and "label" in r]
    prov = provenance()
    any_rec = ok[0] if ok else {}
    lines = [
        "# Transfer paths inside the decode step (issue 5 item 1)",
        "",
        f"Measured on **{table['device']}**, {table['date']}, commit `{table['commit']}` (from the records of "
        f"`{src}`: {len(ok)} runs, {len(errors)} failed). Summarized at commit `{prov['commit']}`, "
        f"{prov['date_utc']}.",
        "",
        f"Setup: lookahead, context {any_rec.get('context', '?')}, synthetic selection, fetch ratio "
        f"{any_rec.get('fetch_ratio', '?')}, top-K {any_rec.get('top_k', '?')}, KV budget "
        f"{any_rec.get('kv_budget_gb', '?')} GB, model {any_rec.get('model', '?')} (dummy weights), "
        f"{any_rec.get('steps', '?')} timed steps after {any_rec.get('warmup', '?')} warm-up.",
        "",
        "Exposed = TPOT − the matching no-transfer TPOT (graph-captured runs against the graph reference, eager "
        "runs against the eager one). Copy ms / step, GB/s and MB / step come from the same configuration's eager profiled "
        "run (CUDA events around the copy stream's work: for the host path the DMA + scatter, the CPU gather is "
        "its own column). Hidden = 1 − exposed / copy ms, clipped to [0, 1]; hidden (prof.) is the profiled "
        "run's own 1 − stall / copy. Winner = lowest TPOT p50 among the transferring configurations.",
        "",
    ]
    for n, s in summary.items():
        w = s["winner"]
        lines += [
            f"## {n} requests",
            "",
            "| config | exec | TPOT p50 ms | tok/s | exposed ms | copy ms/step | GB/s | MB/step | hidden | "
            "hidden (prof.) | CPU gather ms |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in s["rows"]:
            name = f"**{r['config']}**" if r is w else r["config"]
            if r["admitted"] is not None and r["admitted"] != n:
                name += f" (admitted {r['admitted']})"
            lines.append(
                f"| {name} | {r['exec']} | {_f(r['tpot_ms'])} | {_f(r['throughput_tok_s'], 1)} | "
                f"{_f(r['exposed_ms'])} | {_f(r['copy_ms'])} | {_f(r['gb_s'], 1)} | {_f(r['mb_step'], 1)} | "
                f"{_pct(r['hidden'])} | {_pct(r['hidden_profiled'])} | {_f(r['cpu_gather_ms'])} |"
            )
        lines += [
            "",
            f"Winner: **{w['config']}** ({w['exec']}), TPOT {_f(w['tpot_ms'])} ms."
            if w
            else "Winner: none (no transferring run succeeded).",
            "",
        ]
    if errors:
        lines += ["## Failed runs", ""] + [f"- `{r['label']}`: {r.get('error', '')}" for r in errors] + [""]
    lines += [
        "## The engine's choice (`transfer=auto`)",
        "",
        "`oasis_exec.transfer.choice.choose(lanes)` takes the entry with the nearest concurrency (ties: the smaller).",
        "",
        "| concurrency | path | UVA programs | host threads | side streams | copy graph | TPOT p50 ms | "
        "no-transfer ms | exec |",
        "| ---: | --- | ---: | ---: | --- | --- | ---: | ---: | --- |",
    ]
    for c in table["choices"]:
        cg = "–" if c["path"] != "uva" else "on" if c.get("copy_graph") else "off"
        lines.append(
            f"| {c['concurrency']} | {c['path']} | {c['uva_programs'] or '–'} | "
            f"{c['host_threads'] or '–'} | {c.get('stream_priority', 'normal')} | {cg} | {_f(c['tpot_ms'])} | "
            f"{_f(c['no_transfer_tpot_ms'])} | "
            f"{c['exec']} |"
        )
    tpath = table_out or f"{prefix}_table.json"
    shown = os.path.relpath(os.path.abspath(tpath), REPO)
    lines += [
        "",
        f"Table written to `{tpath if shown.startswith('..') else shown}`; the engine reads "
        "`oasis_exec/transfer/table.json` (copy it there, or pass `--table-out oasis_exec/transfer/table.json`).",
    ]
    d = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(d, exist_ok=True)
    write_markdown(
        f"{prefix}.md", lines, os.path.join(os.path.dirname(os.path.abspath(__file__)), "transfer_paths_notes.md")
    )
    with open(tpath, "w") as fh:
        fh.write(json.dumps(table, indent=2) + "\n")
    return {"summary": summary, "table": table, "md": f"{prefix}.md", "table_path": tpath}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSONL to append run records to (run mode)")
    ap.add_argument("--summarize", nargs=2, metavar=("IN_JSONL", "OUT_PREFIX"))
    ap.add_argument("--table-out", help="summarize: where the choice table goes (default OUT_PREFIX_table.json)")
    ap.add_argument("--concurrency", type=ints, default=[64, 32, 8])
    ap.add_argument("--programs", type=ints, default=[4, 8, 16, 32])
    ap.add_argument("--threads", type=ints, default=[8, 16])
    ap.add_argument(
        "--host-kernels",
        type=lambda x: [v for v in x.split(",") if v],
        default=["torch"],
        help="host path gathers: torch,native (native: config host{t}-nat)",
    )
    ap.add_argument(
        "--switch-us",
        type=ints,
        default=[0],
        help="host path runs under these sys.setswitchinterval values, microseconds (0: the default, "
        "5000; others: config suffix -sw{us}, reported but never chosen)",
    )
    ap.add_argument(
        "--priorities",
        type=lambda x: [v for v in x.split(",") if v],
        default=["normal"],
        help="side-stream priorities to run each transferring config at: normal,high",
    )
    ap.add_argument(
        "--uva-kernels",
        type=lambda x: [v for v in x.split(",") if v],
        default=["loads"],
        help="the UVA gather's kernels to run: loads,tma (tma configs end in -tma)",
    )
    ap.add_argument(
        "--in-graph",
        action="store_true",
        help="also run each UVA config with its copies inside the step's graph (copy_graph off)",
    )
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--top-k", type=int, default=128)
    ap.add_argument("--fetch-ratio", type=float, default=0.05)
    ap.add_argument("--kv-budget-gb", type=float, default=52.0)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test with --model tiny")
    ap.add_argument("--retry-errors", action="store_true", help="rerun labels whose record is an error")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.summarize:
        res = summarize(*a.summarize, table_out=a.table_out)
        print(f"wrote {res['md']} and {res['table_path']}")
        return 0
    if not a.out:
        ap.error("--out is required (or --summarize IN OUT_PREFIX)")
    a.concurrency = sorted(set(a.concurrency), reverse=True)  # largest first: the first run pins the largest pool
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
