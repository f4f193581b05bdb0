"""The headline report from the sweep's records: dense against lookahead at 52 GB, overlap, dense against vLLM.

    python experiments/dense_vs_lookahead_throughput/dense_vs_lookahead_report.py --sweep OUT/headline.jsonl [--sweep MORE.jsonl] [--transfer-paths TP.jsonl] \\
        [--out-dir DIR] [--name headline]

Reads the JSON lines of ``experiments/dense_vs_lookahead_throughput/h200_headline.py`` (bench records plus ``label``, ``kind``, ``variant``,
``status``; older files without ``kind`` / ``variant`` are classified from the record's fields) and writes
``<name>.md`` and ``<name>.png`` in ``--out-dir`` (default: ``results/`` beside this script; name default ``headline``) (throughput and TPOT against concurrency, dense and lookahead
per context, the sensitivity variants as extra curves). The records' dates and commits are inside the report.
Every measured number comes from the records; a figure the issue asks for whose record is missing reads "not run".
The fixed figures are issue 5's: goals (2.5x, 1.05x, 10%, 1.25x), the paper's 2.07x and vLLM 0.26's figures on the
same H200 (docs/DESIGN.md). ``--transfer-paths``: records of ``experiments/transfer_paths/transfer_paths.py``, listed as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.reporting import ensure_repo_on_path, fmt, provenance  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

ensure_repo_on_path()

GOAL_RATIO, PAPER_RATIO, GOAL_OVERLAP, GOAL_VLLM, GOAL_ROOF = 2.5, 2.07, 1.05, 0.10, 1.25
BUDGET_GB = 52.0
# vLLM 0.26.0 on the same H200 (docs/DESIGN.md): (context, "52" | "whole", concurrency) -> decode tok/s;
# issue 5 item 3 names the first four
VLLM = {
    (16384, "whole", 8): 810.0,
    (16384, "whole", 32): 1338.0,
    (16384, "52", 16): 1104.0,
    (32768, "whole", 8): 553.0,
    (16384, "52", 21): 1073.0,
    (32768, "52", 10): 508.0,
}
VLLM_ITEM3 = [(16384, "whole", 8), (16384, "whole", 32), (16384, "52", 16), (32768, "whole", 8)]
VLLM_BEST_52 = {16384: 1104.0, 32768: 508.0}
VARIANT_NAMES = {
    "base": "base",
    "drift2": "drift ×2",
    "drift4": "drift ×4",
    "fr0.02": "fetch 0.02",
    "fr0.1": "fetch 0.10",
    "notransfer": "no transfer",
    "unfused": "unfused ops",
}


# -- records -----------------------------------------------------------------------------------------------------------


def load(paths) -> tuple:
    """(final records, in file order: the last line of each label wins, except that an ok stays; labels whose last
    line is 'started': died). Records without a label get one from their position."""
    last, order = {}, []
    for p in paths:
        for i, line in enumerate(open(p)):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if not isinstance(r, dict):
                continue
            lb = r.get("label") or f"{Path(p).name}:{i + 1}"
            r["label"] = lb
            r.setdefault("status", "ok")
            if lb not in last:
                order.append(lb)
            if last.get(lb, {}).get("status") == "ok" and r["status"] != "ok":
                continue
            last[lb] = r
    died = [lb for lb in order if last[lb]["status"] == "started"]
    for lb in died:
        last[lb] = dict(last[lb], status="error", error="the process died during this run (no final record)")
    return [last[lb] for lb in order], died


def variant_of(r: dict) -> str:
    if r.get("variant") and r["variant"] != "dense":
        return r["variant"]
    if r.get("no_transfer"):
        return "notransfer"
    if r.get("fused_ops") is False:
        return "unfused"
    if r.get("layer_events") or r.get("stage_ms_per_step"):
        return "profiled"  # eager steps with stage timers (--profile): not the graph-captured step
    if r.get("mode") == "dense":
        return "base"
    if r.get("transfer") not in (None, "uva"):
        return f"transfer-{r['transfer']}"
    syn = r.get("synthetic_params") or {}
    if "drift_rate" in syn:
        from oasis_core.synthetic import SyntheticParams

        return f"drift{syn['drift_rate'] / SyntheticParams().drift_rate:g}"
    fr = r.get("fetch_ratio")
    if fr is not None and abs(fr - 0.05) > 1e-9:
        return f"fr{fr:g}"
    return "base"


def budget_of(r: dict) -> str:
    kv = r.get("kv_budget_gb")
    return "52" if kv is not None and abs(kv - BUDGET_GB) < 1e-6 else "whole"


class Index:
    """Records by (context, mode, budget class, variant, requested concurrency)."""

    def __init__(self, recs: list):
        self.recs = recs
        self.by = {}
        for r in recs:
            if r.get("mode") is None or r.get("context") is None:
                continue
            n = r.get("requested_concurrency") or r.get("concurrency")
            key = (r["context"], r["mode"], budget_of(r), variant_of(r), n)
            old = self.by.get(key)
            if old is None or old.get("status") != "ok" or r.get("status") == "ok":
                self.by[key] = r

    def get(self, ctx, mode, budget, variant, n):
        return self.by.get((ctx, mode, budget, variant, n))

    def ok(self, ctx, mode, budget="52", variant="base") -> list:
        """ok records of a curve, by concurrency."""
        out = [
            r
            for (c, m, b, v, n), r in self.by.items()
            if (c, m, b, v) == (ctx, mode, budget, variant) and r.get("status") == "ok"
        ]
        return sorted(out, key=lambda r: r["concurrency"])

    def curve(self, ctx, mode, budget="52", variant="base") -> list:
        """every record of a curve (ok or not), by requested concurrency."""
        out = [r for (c, m, b, v, n), r in self.by.items() if (c, m, b, v) == (ctx, mode, budget, variant)]
        return sorted(out, key=lambda r: r.get("requested_concurrency") or r.get("concurrency") or 0)

    def contexts(self) -> list:
        return sorted({k[0] for k in self.by})

    def variants(self, ctx) -> list:
        vs = {k[3] for k in self.by if k[0] == ctx and k[1] != "dense" and k[2] == "52"}
        main = ("base", "drift2", "drift4", "fr0.02", "fr0.1")
        return [v for v in main if v in vs] + sorted(vs - set(main) - {"notransfer", "unfused", "profiled"})


def best(recs: list):
    return max(recs, key=lambda r: r["throughput_tok_s"]) if recs else None


def roofline_ms(r: dict) -> tuple:
    """(roofline ms, weights GB, KV GB read per step): (W + n * T * b) / 4.3 TB/s, W = ModelSpec.weight_bytes,
    T = context + warmup + steps / 2 (mean tokens a request holds over the timed steps), b = KV bytes per token."""
    from oasis_core.geometry import KVGeometry
    from oasis_core.specs import get_hardware, get_model

    try:
        m = get_model(r.get("model") or "qwen3-8b")
    except ValueError:  # a local checkpoint directory: no preset to size it from
        return None, None, None
    bw = get_hardware("h200").measured_attn_read_bytes_per_s
    tokens = r["context"] + (r.get("warmup") or 0) + (r.get("steps") or 0) / 2
    kv = r["concurrency"] * tokens * KVGeometry(m).bytes_per_token
    return 1e3 * (m.weight_bytes + kv) / bw, m.weight_bytes / 1e9, kv / 1e9


def ctxk(ctx) -> str:
    return f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)


def why(r) -> str:
    if r is None:
        return "not run"
    if r.get("status") == "ok":
        return "ok"
    txt = r.get("reason") or r.get("error") or r.get("status")
    return f"{r.get('status')}: {txt}".replace("|", "/")


def tok(r) -> str:
    return fmt(r["throughput_tok_s"]) if r is not None and r.get("status") == "ok" else "not run"


def tn(r) -> str:
    """'tok/s (n)' of an ok record, else 'not run'."""
    return f"{fmt(r['throughput_tok_s'])} ({r['concurrency']})" if r is not None else "not run"


def ms(r, key="tpot_ms_p50") -> str:
    return fmt(r.get(key), 2) if r is not None and r.get("status") == "ok" and r.get(key) is not None else "not run"


# -- report ------------------------------------------------------------------------------------------------------------


def report(recs: list, died: list, idx: Index, sweeps, tp_recs, png_name: str) -> list:
    ok = [r for r in recs if r.get("status") == "ok"]
    ctxs = idx.contexts()
    L = [f"# Lookahead against dense at {BUDGET_GB:g} GB, overlap, dense against vLLM", ""]
    devs = sorted({r.get("device", "?") for r in ok})
    dates = sorted(r["date"] for r in ok if r.get("date"))
    commits = sorted({str(r.get("commit", "?")) for r in ok})
    mem = sorted({r.get("mem_total_gb") for r in ok if r.get("mem_total_gb")})
    p = provenance()
    L += [
        f"Device: {', '.join(devs) or 'none'}; records dated {dates[0] if dates else '?'} to "
        f"{dates[-1] if dates else '?'}; executor commit(s) of the records: {', '.join(commits) or '?'}; host "
        f"MemTotal {', '.join(f'{m:.1f} GB' for m in mem) or 'not recorded'}. Sources: "
        + ", ".join(f"`{Path(s).name}`" for s in sweeps)
        + f" ({len(recs)} runs: {len(ok)} ok, {len(recs) - len(ok)} not). Report made at commit `{p['commit']}`, "
        f"{p['date_utc']}.",
        "",
        "Setup (from the records): dummy weights, synthetic selection, top-K "
        f"{', '.join(sorted({str(r.get('top_k')) for r in ok if r.get('top_k')})) or '?'}, CUDA graphs "
        f"{', '.join(sorted({str(r.get('cuda_graph')) for r in ok if 'cuda_graph' in r})) or '?'}, timed steps "
        f"{', '.join(sorted({str(r.get('steps')) for r in ok if r.get('steps')})) or '?'} after "
        f"{', '.join(sorted({str(r.get('warmup')) for r in ok if r.get('warmup') is not None})) or '?'} warm-up; "
        "throughput = requests × timed steps / their time; TPOT = step time.",
        "",
        f"![throughput and TPOT]({png_name})",
        "",
    ]

    # 1. headline
    L += [
        "## Best against best at 52 GB (item 4)",
        "",
        f"Goal ≥ {GOAL_RATIO}× (the paper: {PAPER_RATIO}×). Best of each curve at the 52 GB KV budget.",
        "",
        "| context | dense best tok/s (n) | lookahead best tok/s (n) | ratio | goal met | vLLM best at 52 GB | "
        "lookahead / vLLM |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ctx in ctxs:
        d, la = best(idx.ok(ctx, "dense")), best(idx.ok(ctx, "lookahead"))
        ratio = la["throughput_tok_s"] / d["throughput_tok_s"] if d and la else None
        v = VLLM_BEST_52.get(ctx)
        L.append(
            f"| {ctxk(ctx)} | {tn(d)} | "
            f"{tn(la)} | "
            f"{fmt(ratio, 2) + '×' if ratio else 'not run'} | "
            f"{('yes' if ratio >= GOAL_RATIO else 'no') if ratio else 'not run'} | {fmt(v) if v else '–'} | "
            f"{fmt(la['throughput_tok_s'] / v, 2) + '×' if la and v else '–'} |"
        )
    L.append("")

    # 2. curves
    L += ["## Curves (52 GB KV budget)", ""]
    for ctx in ctxs:
        L += [
            f"### {ctxk(ctx)}",
            "",
            "| mode | n | status | tok/s | TPOT p50 ms | TPOT p99 ms | copied MB/step | host pool GB | "
            "roofline ms | step / roofline |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for mode in ("dense", "lookahead"):
            for r in idx.curve(ctx, mode):
                okr = r.get("status") == "ok"
                roof = roofline_ms(r)[0] if okr and mode == "dense" else None
                n = r.get("concurrency")
                if okr and r.get("requested_concurrency") not in (None, n):
                    n = f"{n} of {r['requested_concurrency']}"
                L.append(
                    f"| {mode} | {n} | {why(r)} | {tok(r)} | {ms(r)} | {ms(r, 'tpot_ms_p99')} | "
                    f"{fmt(r['bytes_moved_per_step'] / 1e6) if okr else '–'} | "
                    f"{fmt(r.get('host_kv_gb')) if mode != 'dense' else '–'} | {fmt(roof, 2)} | "
                    f"{fmt(r['tpot_ms_p50'] / roof, 2) + '×' if roof else '–'} |"
                )
        L.append("")

    # 3. sensitivity
    for ctx in ctxs:
        vs = idx.variants(ctx)
        if vs == ["base"] or not vs:
            continue
        ns = sorted(
            {
                r.get("requested_concurrency") or r["concurrency"]
                for v in vs
                for r in idx.curve(ctx, "lookahead", "52", v)
            }
        )
        L += [
            f"## Sensitivity at {ctxk(ctx)} (item 4): tok/s, and against the base run of the same n",
            "",
            "| n | " + " | ".join(VARIANT_NAMES.get(v, v) for v in vs) + " |",
            "| --- |" + " --- |" * len(vs),
        ]
        for n in ns:
            b = idx.get(ctx, "lookahead", "52", "base", n)
            cells = []
            for v in vs:
                r = idx.get(ctx, "lookahead", "52", v, n)
                c = tok(r)
                if v != "base" and all(x is not None and x.get("status") == "ok" for x in (r, b)):
                    c += f" ({r['throughput_tok_s'] / b['throughput_tok_s']:.3f})"
                cells.append(c)
            L.append(f"| {n} | " + " | ".join(cells) + " |")
        d = best(idx.ok(ctx, "dense"))
        L += [
            "",
            "Best of each variant's curve against dense's best:",
            "",
            "| variant | best tok/s (n) | copied MB/step there | missing blocks / step there | / dense best |",
            "| --- | --- | --- | --- | --- |",
        ]
        for v in vs:
            b = best(idx.ok(ctx, "lookahead", "52", v))
            L.append(
                f"| {VARIANT_NAMES.get(v, v)} | "
                f"{tn(b)} | "
                f"{fmt(b['bytes_moved_per_step'] / 1e6) if b else '–'} | "
                f"{fmt(b.get('drift_blocks_per_step'), 0) if b else '–'} | "
                f"{fmt(b['throughput_tok_s'] / d['throughput_tok_s'], 2) + '×' if b and d else 'not run'} |"
            )
        L.append("")

    # 4. overlap
    L += [
        "## Overlap (item 2): lookahead TPOT / the same step without transfers",
        "",
        f"Goal ≤ {GOAL_OVERLAP} at 16 and 64 requests, 16K.",
        "",
        "| context | n | lookahead TPOT p50 ms | no-transfer TPOT p50 ms | ratio | goal met | copied MB/step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    pairs = sorted({(k[0], k[4]) for k in idx.by if k[3] == "notransfer"} | {(16384, 16), (16384, 64)})
    for ctx, n in pairs:
        a, b = idx.get(ctx, "lookahead", "52", "base", n), idx.get(ctx, "lookahead", "52", "notransfer", n)
        okab = all(x is not None and x.get("status") == "ok" for x in (a, b))
        ratio = a["tpot_ms_p50"] / b["tpot_ms_p50"] if okab else None
        L.append(
            f"| {ctxk(ctx)} | {n} | {ms(a)} | {ms(b)} | {fmt(ratio, 3) if ratio else 'not run'} | "
            f"{('yes' if ratio <= GOAL_OVERLAP else 'no') if ratio else 'not run'} | "
            f"{fmt(a['bytes_moved_per_step'] / 1e6) if okab else '–'} |"
        )
    L.append("")

    # 5. dense vs vLLM and the roofline
    r0 = next((r for r in ok if r.get("mode") == "dense" and roofline_ms(r)[0] is not None), None)
    w_gb = roofline_ms(r0)[1] if r0 else None
    b_kib = None
    if r0:
        from oasis_core.geometry import KVGeometry
        from oasis_core.specs import get_model

        b_kib = KVGeometry(get_model(r0.get("model") or "qwen3-8b")).bytes_per_token / 1024
    L += [
        "## Dense against vLLM 0.26 and the HBM roofline (item 3)",
        "",
        f"Goal: within {GOAL_VLLM:.0%} of vLLM, step ≤ {GOAL_ROOF}× the roofline. Roofline = (W + n × T × b) / "
        "4.3 TB/s: W = `oasis_core.specs` weight bytes of the model (all parameters, bf16"
        + (f": {w_gb:.2f} GB" if w_gb else "")
        + "), T = context + warm-up + timed steps / 2 (mean tokens a request "
        "holds while timed), b = `KVGeometry.bytes_per_token`"
        + (f" ({b_kib:g} KiB)" if b_kib else "")
        + ", 4.3 TB/s = the H200's "
        "measured attention read rate (`oasis_core.specs`, h200). Rows in italics are vLLM figures issue 5 does "
        "not name.",
        "",
        "| context | KV budget | n | ours tok/s | vLLM tok/s | ours / vLLM | within 10% | TPOT p50 ms | roofline ms "
        "| step / roofline | ≤ 1.25× |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in VLLM_ITEM3 + [k for k in VLLM if k not in VLLM_ITEM3]:
        ctx, bud, n = key
        if ctx not in ctxs and key not in VLLM_ITEM3:
            continue
        r = idx.get(ctx, "dense", bud, "base", n)
        okr = r is not None and r.get("status") == "ok"
        ratio = r["throughput_tok_s"] / VLLM[key] if okr else None
        roof = roofline_ms(r)[0] if okr else None
        step = r["tpot_ms_p50"] / roof if okr and roof else None
        nr = "not run" if not okr else "–"  # "–": ran, but the model has no preset to size the roofline
        it = "" if key in VLLM_ITEM3 else "*"
        L.append(
            f"| {it}{ctxk(ctx)}{it} | {'52 GB' if bud == '52' else 'whole H200'}"
            f"{' (' + fmt(r['kv_budget_gb'], 0) + ' GB)' if okr and bud == 'whole' else ''} | {n} | {tok(r)} | "
            f"{fmt(VLLM[key])} | {fmt(ratio, 2) if okr else 'not run'} | "
            f"{('yes' if ratio >= 1 - GOAL_VLLM else 'no') if okr else 'not run'} | {ms(r)} | "
            f"{fmt(roof, 2) if roof else nr} | {fmt(step, 2) + '×' if step else nr} "
            f"| {('yes' if step <= GOAL_ROOF else 'no') if step else nr} |"
        )
    L.append("")

    # 6. host memory
    L += [
        "## Where host memory bound lookahead",
        "",
        "| context | host pool GB a request | largest n that ran | its pool GB | MemAvailable before it GB | "
        "first n above it not run | why | MemAvailable then GB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ctx in ctxs:
        cur = idx.curve(ctx, "lookahead")
        if not cur:
            continue
        oks = [r for r in cur if r.get("status") == "ok"]
        top = max(oks, key=lambda r: r["concurrency"]) if oks else None
        per = [
            r["host_kv_gb"] / (r.get("requested_concurrency") or r["concurrency"]) for r in cur if r.get("host_kv_gb")
        ]
        above = [
            r
            for r in cur
            if r.get("status") != "ok"
            and (r.get("requested_concurrency") or r.get("concurrency") or 0) > (top["concurrency"] if top else 0)
        ]
        first = min(above, key=lambda r: r.get("requested_concurrency") or r["concurrency"]) if above else None
        L.append(
            f"| {ctxk(ctx)} | {fmt(min(per), 3) if per else '–'} | {top['concurrency'] if top else 'none'} | "
            f"{fmt(top.get('host_kv_gb')) if top else '–'} | "
            f"{fmt(top.get('mem_available_gb')) if top else '–'} | "
            f"{(first.get('requested_concurrency') or first.get('concurrency')) if first else 'none failed'} | "
            f"{why(first) if first else 'host memory did not bind within the plan'} | "
            f"{fmt(first.get('mem_available_gb')) if first else '–'} |"
        )
    L.append("")

    # 7. fusion A/B
    fab = [(k, r) for k, r in idx.by.items() if k[3] == "unfused"]
    if fab:
        L += [
            "## Kernel fusion A/B (fused_ops on vs off, same call)",
            "",
            "| context | mode | n | fused tok/s | unfused tok/s | fused TPOT p50 ms | unfused TPOT p50 ms | "
            "unfused / fused TPOT |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for (ctx, mode, bud, _, n), u in sorted(fab, key=lambda x: (x[0][0], x[0][1], x[0][4])):
            f = idx.get(ctx, mode, bud, "base", n)
            okb = all(x is not None and x.get("status") == "ok" for x in (f, u))
            L.append(
                f"| {ctxk(ctx)} | {mode} | {n} | {tok(f)} | {tok(u)} | {ms(f)} | {ms(u)} | "
                f"{fmt(u['tpot_ms_p50'] / f['tpot_ms_p50'], 3) if okb else 'not run'} |"
            )
        L.append("")

    # 8. not ok
    bad = [r for r in recs if r.get("status") != "ok"]
    L += ["## Runs that did not complete", ""]
    if bad:
        L += ["| label | status | reason |", "| --- | --- | --- |"]
        L += [f"| {r['label']} | {r.get('status')} | {why(r).split(': ', 1)[-1]} |" for r in bad]
    else:
        L.append("None.")
    L.append("")

    # 9. transfer paths
    if tp_recs is not None:
        L += ["## Transfer-path records (`--transfer-paths`, listed as recorded)", ""]
        if tp_recs:
            L += [
                "| label | status | mode | context | n | transfer | tok/s | TPOT p50 ms | TPOT p99 ms | "
                "copied MB/step | transfer GB/s | hidden |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for r in tp_recs:
                okr = r.get("status") == "ok"
                mb = r.get("bytes_moved_per_step") if okr else None
                L.append(
                    f"| {r['label']} | {r.get('status')} | {r.get('mode', '–')} | {r.get('context', '–')} | "
                    f"{r.get('concurrency', '–')} | {r.get('transfer') or '–'} | {tok(r)} | {ms(r)} | "
                    f"{ms(r, 'tpot_ms_p99')} | "
                    f"{fmt(mb / 1e6) if mb is not None else '–'} | "
                    f"{fmt(r.get('transfer_gb_s')) if okr else '–'} | "
                    f"{fmt(r.get('hidden_fraction'), 3) if okr else '–'} |"
                )
        else:
            L.append("The file holds no records.")
        L.append("")
    return L


def plot(idx: Index, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctxs = idx.contexts() or [16384]
    fig, axes = plt.subplots(2, len(ctxs), figsize=(6.2 * len(ctxs), 8.4), squeeze=False)
    styles = {"drift2": ":", "drift4": "-.", "fr0.02": (0, (5, 2)), "fr0.1": (0, (1, 1))}
    for j, ctx in enumerate(ctxs):
        ax_t, ax_p = axes[0][j], axes[1][j]
        for mode, color, marker in (("dense", "tab:gray", "o"), ("lookahead", "tab:blue", "s")):
            rs = idx.ok(ctx, mode)
            if rs:
                x = [r["concurrency"] for r in rs]
                ax_t.plot(x, [r["throughput_tok_s"] for r in rs], marker=marker, color=color, lw=2, label=mode)
                ax_p.plot(x, [r["tpot_ms_p50"] for r in rs], marker=marker, color=color, lw=2, label=mode)
        for v in idx.variants(ctx):
            if v == "base":
                continue
            rs = idx.ok(ctx, "lookahead", "52", v)
            if rs:
                x = [r["concurrency"] for r in rs]
                kw = dict(
                    color="tab:orange" if v.startswith("drift") else "tab:green",
                    lw=1.2,
                    ls=styles.get(v, "--"),
                    marker=".",
                    label=f"lookahead, {VARIANT_NAMES.get(v, v)}",
                )
                ax_t.plot(x, [r["throughput_tok_s"] for r in rs], **kw)
                ax_p.plot(x, [r["tpot_ms_p50"] for r in rs], **kw)
        nt = idx.ok(ctx, "lookahead", "52", "notransfer")
        if nt:
            x = [r["concurrency"] for r in nt]
            kw = dict(color="tab:red", ms=8, label="lookahead, no transfer")
            ax_t.plot(x, [r["throughput_tok_s"] for r in nt], "x", **kw)
            ax_p.plot(x, [r["tpot_ms_p50"] for r in nt], "x", **kw)
        if ctx in VLLM_BEST_52:
            ax_t.axhline(VLLM_BEST_52[ctx], color="black", ls=":", lw=1, label="vLLM 0.26 best at 52 GB")
        d = best(idx.ok(ctx, "dense"))
        if d:
            ax_t.axhline(
                GOAL_RATIO * d["throughput_tok_s"],
                color="tab:purple",
                ls="--",
                lw=0.8,
                label=f"{GOAL_RATIO}× dense best",
            )
        ax_t.set_title(f"{ctxk(ctx)} context, 52 GB KV budget: throughput")
        ax_p.set_title(f"{ctxk(ctx)}: TPOT p50")
        ax_t.set_ylabel("decode tok/s")
        ax_p.set_ylabel("ms per step")
        for ax in (ax_t, ax_p):
            ax.set_xlabel("concurrent requests")
            ax.grid(alpha=0.3)
        ax_t.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--sweep",
        action="append",
        required=True,
        help="JSON lines of experiments/dense_vs_lookahead_throughput/h200_headline.py",
    )
    ap.add_argument(
        "--transfer-paths", default=None, help="JSON lines of experiments/transfer_paths/transfer_paths.py (listed)"
    )
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--name", default="headline", help="file-name stem: NAME.md, NAME.png")
    a = ap.parse_args(argv)
    recs, died = load(a.sweep)
    idx = Index(recs)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, png = out / f"{a.name}.md", out / f"{a.name}.png"
    tp = None
    if a.transfer_paths:
        tp = load([a.transfer_paths])[0] if Path(a.transfer_paths).exists() else []
    lines = report(recs, died, idx, a.sweep, tp, png.name)
    md.write_text("\n".join(lines) + "\n")
    plot(idx, png)
    print(f"wrote {md} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
