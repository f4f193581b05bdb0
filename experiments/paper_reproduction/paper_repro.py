"""Reproduce the OasisKV paper's Fig. 11, Table 2 and Fig. 14 with the simulator (H100 SXM preset, Qwen3-8B).

    python experiments/paper_reproduction/paper_repro.py [--parts fig11,table2,fig14] [--output-tokens 1024] [--quick]
    python experiments/paper_reproduction/paper_repro.py --parts fig14-novelty   # only the novelty rows, merged into the existing JSON

Writes ``results/sim_paper_repro.{md,json}`` (beside this script) and ``fig11_*.png``, ``table2_fetch_ratio.png``,
``fig14_rpf.png``. The markdown's explanations of the disagreements are written against the numbers this script
produced at the commit named at its top; rerun it after the simulator changes.

Workloads (the paper's setup as far as it is stated):

- Fig. 11 / Table 2: closed loop at fixed concurrency (``SimConfig.arrival='closed'``: N requests in flight, each
  completion releases the next), equal requests of 16K or 32K prompt tokens and ``--output-tokens`` output tokens.
  The throughput compared with the paper is the *decode-phase* rate (output tokens per second over the steps that
  did no prefill work), because the paper's figures satisfy throughput ≈ concurrency / TPOT (dense: 16 / 23.5 ms =
  681 tok/s ≈ 676); the end-to-end rate (prefill included) is reported beside it.
- Host DRAM: the paper runs one H100 of an 8-GPU node; with the other GPUs idle the whole 2 TB of the node is
  available, so ``host_bytes`` = 0.9 × 2,048 GB (the simulator's default is the per-GPU share, 230 GB, which caps
  16K lookahead at ~95 requests; shown once in the JSON as ``fig11_default_host``).
- Fig. 14: ``oasis_core.rpf`` directly (one request, all 36 layers × 8 KV heads, synthetic selection) and the
  simulator's ``split='rpf'`` mode as a cross-check.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common import reporting as common  # noqa: E402

HERE = Path(__file__).resolve().parent

common.ensure_repo_on_path()

import numpy as np  # noqa: E402

from oasis_core.fetchcap import CapContext, Fixed, Unlimited  # noqa: E402
from oasis_core.geometry import KVGeometry  # noqa: E402
from oasis_core.rpf import RemoteLedger, handoff_bytes  # noqa: E402
from oasis_core.selection import initial_plan, plan_step  # noqa: E402
from oasis_core.specs import get_model  # noqa: E402
from oasis_core.synthetic import SyntheticParams, SyntheticSelection  # noqa: E402
from oasis_sim.config import SimConfig  # noqa: E402
from oasis_sim.sim import simulate  # noqa: E402
from oasis_sim.workloads import uniform_trace  # noqa: E402

GIB = common.GIB
NODE_HOST_BYTES = 0.9 * 2048e9  # whole DGX H100 host DRAM, 90% usable for KV

# -- paper figures (DESIGN.md, "The idea in numbers") --------------------------------------------------------------
PAPER_FIG11 = {  # (context, mode, concurrency) -> figure
    "throughput": {
        (16384, "dense", 32): 676.0,
        (16384, "dense", 64): 676.0,
        (16384, "dense", 128): 676.0,
        (16384, "lookahead", 128): 1398.0,
    },
    "tpot_ms": {(16384, "lookahead", 16): 17.7, (16384, "dense", 16): 23.5},
}
PAPER_TABLE2 = {0.01: (0.30e9, 2178.0), 1.0: (5.05e9, 824.0)}  # ratio -> (bytes per step, tok/s)
PAPER_FIG14 = {24576: {"rpf_gib": 0.52, "full_gib": 3.37}, 32768: {"rpf_gib": 0.46, "full_gib": 4.50}}
PAPER_DRIFT = {"uncapped_gib": (2.03, 2.53), "capped_gib": 1.61, "output_tokens": 2048}


def base_cfg(**kw) -> SimConfig:
    kw.setdefault("hardware", "h100-sxm")
    kw.setdefault("model", "qwen3-8b")
    kw.setdefault("timeline_steps", 0)
    kw.setdefault("host_bytes", NODE_HOST_BYTES)
    return SimConfig(**kw)


def closed_run(ctx: int, mode: str, conc: int, out_tokens: int, waves: int, **kw) -> dict:
    n = max(waves * conc, conc + 8)
    trace = uniform_trace(n, ctx, out_tokens)
    cfg = base_cfg(mode=mode, concurrency=conc, **kw)
    t0 = time.perf_counter()
    res = simulate(cfg, trace)
    s = res.summary
    st = common.step_stats(res.steps)
    return {
        "context": ctx,
        "mode": mode,
        "concurrency": conc,
        "requests": n,
        "output_tokens": out_tokens,
        "e2e_tok_s": s["throughput_tok_s"],
        "tpot_ms_p50": s["tpot_ms_p50"],
        "ttft_ms_p50": s["ttft_ms_p50"],
        "preemptions": s["preemptions"],
        "resident_recall": s["resident_recall"],
        "stall_ms_total": s["stall_ms_total"],
        "hbm_peak_gb": s["hbm_peak_bytes"] / 1e9,
        "host_peak_gb": s["host_peak_bytes"] / 1e9,
        "wall_s": round(time.perf_counter() - t0, 2),
        **st,
    }


def run_fig11(args) -> dict:
    rows = []
    concs = [1, 4, 8, 16, 32, 64, 128] if not args.quick else [16, 128]
    for ctx in (16384, 32768):
        for mode in ("dense", "lookahead"):
            for c in concs:
                r = closed_run(ctx, mode, c, args.output_tokens, args.waves)
                rows.append(r)
                print(
                    f"fig11 ctx={ctx} {mode:9s} c={c:3d}: decode {r['decode_tok_s']:7.1f} tok/s, e2e "
                    f"{r['e2e_tok_s']:7.1f}, batch {r['running_batch']:5.1f}, step {r['decode_step_ms']:6.1f} ms, "
                    f"TPOT {r['tpot_ms_p50']} ms ({r['wall_s']} s)",
                    flush=True,
                )
    extra = closed_run(16384, "lookahead", 128, args.output_tokens, args.waves, host_bytes=None)
    # How the end-to-end rate and TPOT depend on the output length (prefill of the next request interrupts).
    sens = []
    for out in (256, 1024, 4096):
        for mode in ("dense", "lookahead"):
            for c in (16, 128):
                r = closed_run(16384, mode, c, out, args.waves)
                sens.append(
                    {
                        k: r[k]
                        for k in (
                            "mode",
                            "concurrency",
                            "output_tokens",
                            "e2e_tok_s",
                            "decode_tok_s",
                            "tpot_ms_p50",
                            "decode_step_ms",
                        )
                    }
                )
    return {
        "rows": rows,
        "default_host": extra,
        "output_sensitivity": sens,
        "breakdown": step_breakdown(),
        "h200_anchor": h200_anchor(),
    }


def step_breakdown() -> dict:
    """The roofline predictor's terms of one pure decode step at 16K (ms per step), for the markdown."""
    from oasis_sim.predictor import RooflinePredictor

    m = get_model("qwen3-8b")
    cfg = base_cfg()
    hw = cfg.hardware_spec
    p = RooflinePredictor(m, hw)
    geo = KVGeometry(m, 16)
    L, ctx = m.n_layers, 16384 + 512
    out = {}
    for mode, B in (("dense", 16), ("dense", 20), ("lookahead", 16), ("lookahead", 116)):
        tok = B * (2 if mode == "lookahead" else 1)
        gemm = L * (p.time("gemm_layer", {"tokens": tok}) + p.time("norm_rope", {"tokens": tok}))
        att_tokens = ctx if mode == "dense" else (128 + 1) * 16
        attn = L * p.time("attn_decode", {"kv_bytes": B * att_tokens * geo.bytes_per_token_layer})
        fixed = p.time("step_overhead", {}) + p.time("lm_head", {"tokens": B})
        d = {
            "gemm_ms": gemm * 1e3,
            "attn_ms": attn * 1e3,
            "overhead_lmhead_ms": fixed * 1e3,
            "compute_ms": (gemm + attn + fixed) * 1e3,
        }
        if mode == "lookahead":
            nb = -(-ctx // 16)
            summ = B * nb * 8 * geo.summary_bytes_per_block_head
            side = L * (
                p.time("score", {"summary_bytes": summ})
                + p.time("topk", {"elements": B * nb * 8})
                + p.time("select", {"rows": B * 8})
            )
            x6 = B * geo.rows_per_request * 6 * geo.bytes_per_block_head
            sparse = L * p.time("sparse_overhead", {"requests": B})
            cont = L * p.time("side_contention", {"hbm_bytes": summ + 8.0 * B * nb * 8 + x6 / L})
            d.update(
                {
                    "side_stream_ms": side * 1e3,
                    "h2d_bytes_cap6": x6,
                    "h2d_ms_cap6": x6 / (hw.h2d_bytes_per_s * 0.55) * 1e3,
                    "sparse_overhead_ms": sparse * 1e3,
                    "side_contention_ms": cont * 1e3,
                    "compute_ms": (gemm + attn + fixed + sparse + cont) * 1e3,
                }
            )
        out[f"{mode}_{B}"] = d
    return out


def h200_anchor() -> list:
    """Dense on the H200 preset against the vLLM measurement in DESIGN.md (16K, 52 GB KV budget, 128 outputs)."""
    m = get_model("qwen3-8b")
    hbm = (52e9 + m.weight_bytes) / 0.9
    rows = []
    for c, vllm_tok_s, vllm_tpot in ((16, 1104.0, 14.5), (21, 1073.0, 19.6)):
        r = closed_run(16384, "dense", c, 128, 3, hardware="h200", hbm_bytes=hbm, host_bytes=None)
        rows.append(
            {
                "concurrency": c,
                "vllm_tok_s": vllm_tok_s,
                "vllm_tpot_ms": vllm_tpot,
                "sim_decode_tok_s": r["decode_tok_s"],
                "sim_step_ms": r["decode_step_ms"],
                "sim_batch": r["decode_batch"],
            }
        )
    return rows


def run_table2(args) -> dict:
    rows = []
    for ratio in (0.01, 0.02, 0.05, 0.10, 0.20, 1.0):
        r = closed_run(16384, "lookahead", 128, args.output_tokens, args.waves, fetch_ratio=ratio)
        r["fetch_ratio"] = ratio
        r["pcie_gb_s"] = r["h2d_gb_s_decode"]
        # Bytes per step scale with the batch; the paper's (and the synthetic calibration's) batch is 128.
        r["h2d_bytes_per_step_at_128"] = r["h2d_bytes_per_decode_step_p50"] * 128 / r["decode_batch"]
        rows.append(r)
        print(
            f"table2 ratio={ratio}: {r['h2d_bytes_per_decode_step_p50'] / 1e9:.3f} GB/step, "
            f"{r['decode_tok_s']:.0f} tok/s, batch {r['decode_batch']:.0f}, step {r['decode_step_ms']:.1f} ms, "
            f"PCIe {r['pcie_gb_s']:.1f} GB/s, recall {r['resident_recall']:.3f}",
            flush=True,
        )
    return {"rows": rows}


# -- Fig. 14: RPF with oasis_core directly --------------------------------------------------------------------
def rpf_request(ctx: int, steps: int, seed: int = 0, top_k: int = 128, draft_state=2 * 2**20) -> dict:
    """One request of ``ctx`` prompt tokens: hand-off bytes at both granularities and the remote drift over
    ``steps`` decode steps, uncapped and under the default cap (5% of K), at block granularity."""
    model = get_model("qwen3-8b")
    geo = KVGeometry(model, 16)
    L, H = model.n_layers, model.n_kv_heads
    nb = ctx // 16
    out = {"context": ctx, "n_blocks": nb, "steps": steps}
    for gran in ("block", "head"):
        gen = SyntheticSelection(L * H, nb, top_k, seed=seed, layers=L, kv_heads=H)
        led = RemoteLedger(L, H, nb, geo.bytes_per_block_head)
        units = led.handoff(gen.current().reshape(L, H, -1), gran)
        hb = handoff_bytes(
            units,
            n_blocks=nb,
            layers=L,
            kv_heads=H,
            kv_bytes_per_block_head=geo.bytes_per_block_head,
            summary_bytes_per_block_head=geo.summary_bytes_per_block_head,
            draft_state_bytes=draft_state,
        )
        out[f"handoff_{gran}"] = {
            "blocks_gib": hb.blocks / GIB,
            "local_gib": hb.local / GIB,
            "summaries_gib": hb.summaries / GIB,
            "draft_gib": hb.draft_state / GIB,
            "total_gib": hb.total / GIB,
            "full_gib": hb.full_kv / GIB,
            "reduction": hb.full_kv / hb.total,
            "union_blocks_per_layer": units / (L * H) if gran == "block" else None,
            "blocks_per_row": units / (L * H),
        }
    for gran, label, cap in (
        ("block", "uncapped", Unlimited()),
        ("block", "capped", Fixed(0.05)),
        ("head", "uncapped", Unlimited()),
        ("head", "capped", Fixed(0.05)),
    ):
        if gran == "head":
            label = f"{label}_after_head"
        out[f"drift_{label}"] = rpf_drift(ctx, steps, cap, gran, seed=seed, top_k=top_k)
    return out


def rpf_drift(ctx: int, steps: int, cap, gran: str = "block", params=None, seed: int = 0, top_k: int = 128) -> dict:
    """Remote bytes fetched over ``steps`` decode steps after a hand-off at ``gran`` (one request, 36 x 8 rows),
    Algorithm 2 on the draft under ``cap``; ``params``: SyntheticParams (default: the calibrated defaults)."""
    model = get_model("qwen3-8b")
    geo = KVGeometry(model, 16)
    L, H = model.n_layers, model.n_kv_heads
    nb = ctx // 16
    gen = SyntheticSelection(L * H, nb, top_k, params, seed=seed, layers=L, kv_heads=H)
    led = RemoteLedger(L, H, nb, geo.bytes_per_block_head)
    first = gen.current()
    led.handoff(first.reshape(L, H, -1), gran)
    plan0 = initial_plan(first)
    resident, last_sel = plan0.resident, plan0.last_sel
    mc = cap.max_cap(top_k)
    drift, local_fetch, curve = 0, 0, []
    for i in range(1, steps + 1):
        s = gen.step()
        c = cap.cap(CapContext(step=i, top_k=top_k, rows=L * H))
        plan = plan_step(resident, last_sel, s.draft, c, i, mc)
        resident, last_sel = plan.resident, plan.last_sel
        local_fetch += int(plan.n_fetch.sum())
        drift += led.request(plan.fetch_block.reshape(L, H, -1)).bytes
        if i % 128 == 0:
            curve.append((i, drift / GIB))
    return {"remote_gib": drift / GIB, "h2d_gib": local_fetch * geo.bytes_per_block_head / GIB, "curve": curve}


NOVELTY_GRID = (0.4, 0.45, 0.5)  # SyntheticParams.novelty_rate values tried on the uncapped drift at 24K


def run_novelty(steps: int) -> dict:
    """Calibrate ``novelty_rate`` on the paper's *uncapped* drift at 24K (block-union hand-off), then predict the
    *capped* drift (default cap, 5% of K) with it: the held-out check against the paper's 1.61 GiB. The value picked
    is the one whose uncapped drift is nearest the middle of the paper's 2.03-2.53 GiB."""
    from concurrent.futures import ProcessPoolExecutor

    lo, hi = PAPER_DRIFT["uncapped_gib"]
    target = (lo + hi) / 2
    t0 = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:  # independent runs: one per core

        def go(ctx, cap, rate):
            return pool.submit(rpf_drift, ctx, steps, cap, "block", SyntheticParams(novelty_rate=rate))

        futs = [go(24576, Unlimited(), r) for r in NOVELTY_GRID]
        grid = [
            {"novelty_rate": r, "uncapped_gib": f.result()["remote_gib"], "curve": f.result()["curve"]}
            for r, f in zip(NOVELTY_GRID, futs)
        ]
        for g in grid:
            print(f"novelty {g['novelty_rate']}: 24K uncapped drift {g['uncapped_gib']:.2f} GiB", flush=True)
        best = min(grid, key=lambda g: abs(g["uncapped_gib"] - target))
        rate = best["novelty_rate"]
        jobs = {
            "24576": {"capped": go(24576, Fixed(0.05), rate)},
            "32768": {"capped": go(32768, Fixed(0.05), rate), "uncapped": go(32768, Unlimited(), rate)},
        }
        pred = {ctx: {k: f.result() for k, f in v.items()} for ctx, v in jobs.items()}
    pred["24576"]["uncapped"] = {"remote_gib": best["uncapped_gib"], "curve": best["curve"]}
    for ctx, v in pred.items():
        print(
            f"novelty {rate}: ctx={ctx} capped drift {v['capped']['remote_gib']:.2f} GiB, uncapped "
            f"{v['uncapped']['remote_gib']:.2f} GiB ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return {"grid": grid, "target_gib": target, "chosen": rate, "predicted": pred, "steps": steps}


def run_fig14(args) -> dict:
    steps = 512 if args.quick else PAPER_DRIFT["output_tokens"]
    core = {}
    for ctx in (24576, 32768):
        t0 = time.perf_counter()
        core[ctx] = rpf_request(ctx, steps)
        h, d = core[ctx]["handoff_block"], core[ctx]
        print(
            f"fig14 ctx={ctx}: hand-off block {h['total_gib']:.2f} GiB (head "
            f"{d['handoff_head']['total_gib']:.2f}) vs full {h['full_gib']:.2f}; drift uncapped "
            f"{d['drift_uncapped']['remote_gib']:.2f}, capped {d['drift_capped']['remote_gib']:.2f} GiB; after "
            f"per-head hand-off {d['drift_uncapped_after_head']['remote_gib']:.2f} / "
            f"{d['drift_capped_after_head']['remote_gib']:.2f} GiB "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    novelty = run_novelty(steps)
    # The simulator's split modes on a few such requests (policy rows sampled: 2 layers x 8 heads, scaled).
    sim = {}
    for ctx in (24576, 32768):
        for split, sampling in (("full", "profile"), ("rpf", "profile"), ("rpf", "exact")):
            trace = uniform_trace(4, ctx, steps, gap_s=2.0)
            cfg = base_cfg(mode="lookahead", split=split, host_bytes=None, policy_sampling=sampling)
            res = simulate(cfg, trace)
            net = [r["net_bytes"] for r in res.requests]
            sim[f"{ctx}_{split}_{sampling}"] = {
                "handoff_gib_per_req": res.summary["handoff_bytes"] / len(net) / GIB,
                "net_gib_per_req": float(np.mean(net)) / GIB,
                "ttft_ms_p50": res.summary["ttft_ms_p50"],
                "tpot_ms_p50": res.summary["tpot_ms_p50"],
            }
            print(f"fig14 sim ctx={ctx} split={split} {sampling}: {sim[f'{ctx}_{split}_{sampling}']}", flush=True)
    return {"core": {str(k): v for k, v in core.items()}, "sim": sim, "steps": steps, "novelty": novelty}


# -- report ---------------------------------------------------------------------------------------------------
def plots(res: dict, outdir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if "fig11" in res:
        rows = res["fig11"]["rows"]
        fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
        for i, ctx in enumerate((16384, 32768)):
            for mode, color in (("dense", "tab:blue"), ("lookahead", "tab:orange")):
                sel = [r for r in rows if r["context"] == ctx and r["mode"] == mode]
                c = [r["concurrency"] for r in sel]
                axes[i, 0].plot(c, [r["decode_tok_s"] for r in sel], "o-", color=color, label=f"sim {mode} (decode)")
                axes[i, 0].plot(c, [r["e2e_tok_s"] for r in sel], "x:", color=color, label=f"sim {mode} (e2e)")
                axes[i, 1].plot(c, [r["running_batch"] for r in sel], "o-", color=color, label=f"sim {mode}")
                axes[i, 2].plot(
                    c, [r["decode_step_ms"] for r in sel], "o-", color=color, label=f"sim {mode} (decode step)"
                )
                axes[i, 2].plot(c, [r["tpot_ms_p50"] for r in sel], "x:", color=color, label=f"sim {mode} (TPOT p50)")
                for key, ax in (("throughput", axes[i, 0]), ("tpot_ms", axes[i, 2])):
                    pts = [(k[2], v) for k, v in PAPER_FIG11[key].items() if k[0] == ctx and k[1] == mode]
                    if pts:
                        ax.plot(*zip(*pts), "*", ms=14, color=color, markeredgecolor="k", label=f"paper {mode}")
            for j, (title, unit) in enumerate((("throughput", "tok/s"), ("running batch", "requests"), ("TPOT", "ms"))):
                ax = axes[i, j]
                ax.set_xscale("log", base=2)
                ax.set_title(f"{ctx // 1024}K: {title}")
                ax.set_xlabel("maximum concurrency")
                ax.set_ylabel(unit)
                ax.grid(alpha=0.3)
                if j == 2:
                    ax.set_yscale("log")
            axes[i, 0].legend(fontsize=7)
            axes[i, 2].legend(fontsize=7)
        fig.suptitle("Fig. 11 reproduction: Qwen3-8B on one H100 (simulated), paper points as stars")
        fig.tight_layout()
        fig.savefig(outdir / "fig11_throughput_batch_tpot.png", dpi=110)
        plt.close(fig)
        made.append("fig11_throughput_batch_tpot.png")
    if "table2" in res:
        rows = res["table2"]["rows"]
        x = [str(r["fetch_ratio"]) if r["fetch_ratio"] < 1 else "all" for r in rows]
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        a.plot(x, [r["h2d_bytes_per_decode_step"] / 1e9 for r in rows], "o-", label="sim")
        b.plot(x, [r["decode_tok_s"] for r in rows], "o-", label="sim")
        for ratio, (by, tp) in PAPER_TABLE2.items():
            lab = "all" if ratio >= 1 else str(ratio)
            a.plot([lab], [by / 1e9], "*", ms=14, color="k", label="paper" if ratio < 1 else None)
            b.plot([lab], [tp], "*", ms=14, color="k", label="paper" if ratio < 1 else None)
        a.set_ylabel("host->GPU GB per decode step")
        b.set_ylabel("decode tok/s")
        for ax in (a, b):
            ax.set_xlabel("fetch ratio")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle("Table 2 reproduction: fetch-ratio sweep, 16K, concurrency 128 (simulated)")
        fig.tight_layout()
        fig.savefig(outdir / "table2_fetch_ratio.png", dpi=110)
        plt.close(fig)
        made.append("table2_fetch_ratio.png")
    if "fig14" in res:
        core = res["fig14"]["core"]
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
        xs = np.arange(2)
        w = 0.2
        for k, (name, get) in enumerate(
            (
                ("paper RPF", lambda c: PAPER_FIG14[c]["rpf_gib"]),
                ("sim RPF (block union)", lambda c: core[str(c)]["handoff_block"]["total_gib"]),
                ("sim RPF (per head)", lambda c: core[str(c)]["handoff_head"]["total_gib"]),
                ("full KV", lambda c: core[str(c)]["handoff_block"]["full_gib"]),
            )
        ):
            vals = [get(c) for c in (24576, 32768)]
            a.bar(xs + (k - 1.5) * w, vals, w, label=name)
        a.set_xticks(xs, ["24K", "32K"])
        a.set_ylabel("GiB per request at admission")
        a.legend(fontsize=8)
        a.grid(alpha=0.3, axis="y")
        for ctx, ls in ((24576, "-"), (32768, "--")):
            for lab, color in (
                ("uncapped", "tab:red"),
                ("capped", "tab:green"),
                ("uncapped_after_head", "tab:purple"),
                ("capped_after_head", "tab:olive"),
            ):
                if f"drift_{lab}" not in core[str(ctx)]:
                    continue
                cur = core[str(ctx)][f"drift_{lab}"]["curve"]
                if cur:
                    b.plot(*zip(*cur), ls, color=color, label=f"sim {ctx // 1024}K {lab}")
        b.axhspan(*PAPER_DRIFT["uncapped_gib"], color="tab:red", alpha=0.15, label="paper uncapped 2.03-2.53")
        b.axhline(PAPER_DRIFT["capped_gib"], color="tab:green", alpha=0.6, ls=":", label="paper capped 1.61")
        b.set_xlabel("output tokens")
        b.set_ylabel("GiB fetched remotely after hand-off")
        b.legend(fontsize=7)
        b.grid(alpha=0.3)
        fig.suptitle("Fig. 14 reproduction: RPF transfer per request (oasis_core.rpf, synthetic selection)")
        fig.tight_layout()
        fig.savefig(outdir / "fig14_rpf.png", dpi=110)
        plt.close(fig)
        made.append("fig14_rpf.png")
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="fig11,table2,fig14")
    ap.add_argument("--output-tokens", type=int, default=1024, help="Fig. 11 / Table 2 output tokens per request")
    ap.add_argument("--waves", type=int, default=3, help="closed loop: requests = waves x concurrency")
    ap.add_argument("--quick", action="store_true", help="fewer points (smoke run)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--md-only", action="store_true", help="rewrite the markdown from the existing JSON")
    args = ap.parse_args(argv)
    if args.md_only:
        import json

        outdir = Path(args.out)
        res = json.loads((outdir / "sim_paper_repro.json").read_text())
        if "fig11" in res:  # the predictor's terms are analytic: recompute them with the current predictor
            res["fig11"]["breakdown"] = step_breakdown()
            common.write_json(outdir / "sim_paper_repro.json", res)
        write_md(res, outdir)
        return 0
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    res = {"provenance": common.provenance(), "options": vars(args)}
    if "fig11" in parts:
        res["fig11"] = run_fig11(args)
    if "table2" in parts:
        res["table2"] = run_table2(args)
    if "fig14" in parts:
        res["fig14"] = run_fig14(args)
    if "fig14-novelty" in parts and "fig14" not in parts:
        # Only the novelty rows, merged into the existing results (the rest of Fig. 14 uses the default generator,
        # whose outputs novelty_rate = 0 leaves bit-identical).
        import json

        old = json.loads((outdir / "sim_paper_repro.json").read_text())
        old["fig14"]["novelty"] = run_novelty(512 if args.quick else PAPER_DRIFT["output_tokens"])
        old.setdefault("merged", []).append(
            {"part": "fig14-novelty", "provenance": common.provenance(), "wall_s": round(time.perf_counter() - t0, 1)}
        )
        common.write_json(outdir / "sim_paper_repro.json", old)
        write_md(old, outdir)
        print(f"merged fig14-novelty into {outdir / 'sim_paper_repro.json'}")
        return 0
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["plots"] = plots(res, outdir)
    common.write_json(outdir / "sim_paper_repro.json", res)
    write_md(res, outdir)
    print(f"wrote {outdir / 'sim_paper_repro.json'} ({res['wall_s']} s)")
    return 0


# -- markdown ---------------------------------------------------------------------------------------------------
def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def write_md(res: dict, outdir: Path) -> None:
    f, P = common.fmt, common.fmt_pct
    d = common.pct_diff
    lines = [
        "# OasisKV paper vs simulator: Fig. 11, Table 2, Fig. 14 (H100 SXM preset, Qwen3-8B)",
        "",
        common.provenance_md(res["provenance"]),
        "",
        f"Produced by `python experiments/paper_reproduction/paper_repro.py` ({res['wall_s']} s wall); raw numbers in "
        "`sim_paper_repro.json`. Paper figures are those quoted in `docs/DESIGN.md` (\"The idea in numbers\"); "
        "where the paper gives no figure the cell is `–`. % = (sim − paper) / paper.",
        "",
        "Setup common to every run: `hardware=h100-sxm` (80 GB HBM at 3.35 TB/s, 989 TFLOP/s, PCIe Gen5 "
        "x16: 55.3 GB/s pinned, scattered blocks at 0.55 × that = 30.4 GB/s), `model=qwen3-8b`, "
        "`hbm_utilization=0.9` (55.6 GB of HBM for KV after 16.4 GB of weights), top-K 128 + local block, "
        "block 16, synthetic selection with its default calibration, `transfer_path=dma`, "
        "`policy_sampling=profile`, roofline predictor with default efficiencies.",
        "",
    ]
    if "fig11" in res:
        F = res["fig11"]
        o = res["options"]["output_tokens"]
        lines += [
            "## Fig. 11 — throughput, running batch and TPOT against maximum concurrency",
            "",
            f"Workload: the simulator's closed loop (`arrival=closed`, `--concurrency N`): N requests in "
            f"flight, each completion releases the next; {res['options']['waves']}×N equal requests of 16K or "
            f"32K prompt tokens and {o} output tokens. Host DRAM for KV = 0.9 × the node's 2,048 GB (one GPU "
            "of an idle 8-GPU node, as in the paper; the simulator's default per-GPU share of 230 GB would cap "
            "16K lookahead at "
            f"{F['default_host']['decode_batch']:.0f} requests, {F['default_host']['decode_tok_s']:,.0f} "
            "tok/s decode at concurrency 128).",
            "",
            "Columns: *decode tok/s* = output tokens / time over the steps that did no prefill work (the "
            "paper's figures satisfy throughput ≈ concurrency / TPOT: 16 / 23.5 ms = 681 ≈ 676 tok/s, so this "
            "is the comparable rate); *e2e tok/s* = all output tokens / simulated time, prefills included "
            "(depends on the output length, which DESIGN.md does not give — see the sensitivity table); "
            "*batch* = time-weighted mean of requests decoding over the whole run, *dec. batch* = median "
            "batch of the decode steps; *step* = median pure-decode step (ms); *TPOT p50* = (finish − first "
            "token) / (output − 1), median over requests, which includes the stalls while other requests "
            "prefill (chunked prefill shares the GPU).",
            "",
            _row(
                [
                    "ctx",
                    "mode",
                    "conc.",
                    "paper tok/s",
                    "sim decode tok/s",
                    "%",
                    "sim e2e tok/s",
                    "%",
                    "batch",
                    "dec. batch",
                    "paper TPOT ms",
                    "sim step ms",
                    "%",
                    "sim TPOT p50",
                    "%",
                    "preempt.",
                ]
            ),
            _row(["---"] * 16),
        ]
        for r in F["rows"]:
            key = (r["context"], r["mode"], r["concurrency"])
            pt = PAPER_FIG11["throughput"].get(key)
            pp = PAPER_FIG11["tpot_ms"].get(key)
            lines.append(
                _row(
                    [
                        f"{r['context'] // 1024}K",
                        r["mode"],
                        str(r["concurrency"]),
                        f(pt, 0),
                        f(r["decode_tok_s"], 0),
                        P(d(r["decode_tok_s"], pt)),
                        f(r["e2e_tok_s"], 0),
                        P(d(r["e2e_tok_s"], pt)),
                        f(r["running_batch"]),
                        f(r["decode_batch"], 0),
                        f(pp),
                        f(r["decode_step_ms"]),
                        P(d(r["decode_step_ms"], pp)),
                        f(r["tpot_ms_p50"]),
                        P(d(r["tpot_ms_p50"], pp)),
                        str(r["preemptions"]),
                    ]
                )
            )
        rows = {(r["context"], r["mode"], r["concurrency"]): r for r in F["rows"]}
        la, de = rows[(16384, "lookahead", 128)], rows[(16384, "dense", 128)]
        lines += [
            "",
            f"Speed-up at concurrency 128, 16K: paper 1,398 / 676 = 2.07×; sim decode "
            f"{la['decode_tok_s'] / de['decode_tok_s']:.2f}×, sim e2e {la['e2e_tok_s'] / de['e2e_tok_s']:.2f}×. "
            f"32K: sim decode {rows[(32768, 'lookahead', 128)]['decode_tok_s'] / rows[(32768, 'dense', 128)]['decode_tok_s']:.2f}×.",
            "",
            "![Fig. 11](fig11_throughput_batch_tpot.png)",
            "",
            "Output-length sensitivity (16K): the e2e rate and TPOT p50 move with the output length because "
            "every completion brings a 16K prefill into the batch; the decode-phase figures do not.",
            "",
            _row(["mode", "conc.", "output tokens", "e2e tok/s", "decode tok/s", "TPOT p50 ms", "step ms"]),
            _row(["---"] * 7),
        ]
        for r in F["output_sensitivity"]:
            lines.append(
                _row(
                    [
                        r["mode"],
                        str(r["concurrency"]),
                        str(r["output_tokens"]),
                        f(r["e2e_tok_s"], 0),
                        f(r["decode_tok_s"], 0),
                        f(r["tpot_ms_p50"]),
                        f(r["decode_step_ms"]),
                    ]
                )
            )
        lines += [
            "",
            "Dense anchor (is the dense baseline credible?): the same simulator on the `h200` preset with a "
            "52 GB KV budget, 16K prompts, 128 outputs, against vLLM 0.26 measured on the H200 here "
            "(DESIGN.md):",
            "",
            _row(["conc.", "vLLM tok/s", "sim decode tok/s", "%", "vLLM TPOT ms", "sim step ms", "%"]),
            _row(["---"] * 7),
        ]
        for r in F["h200_anchor"]:
            lines.append(
                _row(
                    [
                        str(r["concurrency"]),
                        f(r["vllm_tok_s"], 0),
                        f(r["sim_decode_tok_s"], 0),
                        P(d(r["sim_decode_tok_s"], r["vllm_tok_s"])),
                        f(r["vllm_tpot_ms"]),
                        f(r["sim_step_ms"]),
                        P(d(r["sim_step_ms"], r["vllm_tpot_ms"])),
                    ]
                )
            )
        b = F["breakdown"]
        lines += [
            "",
            "The roofline predictor's terms of one pure decode step, 16K (+512 decoded) context, ms:",
            "",
            _row(
                [
                    "case",
                    "GEMMs+norms (36 layers)",
                    "attention",
                    "LM head + step overhead",
                    "sparse per-request overhead",
                    "side-stream HBM contention",
                    "compute total",
                    "side stream (score, top-K, select)",
                    "h2d at cap 6 blocks/row",
                ]
            ),
            _row(["---"] * 9),
        ]
        for k, v in b.items():
            lines.append(
                _row(
                    [
                        k.replace("_", " B="),
                        f(v["gemm_ms"]),
                        f(v["attn_ms"]),
                        f(v["overhead_lmhead_ms"]),
                        f(v.get("sparse_overhead_ms")),
                        f(v.get("side_contention_ms")),
                        f(v["compute_ms"]),
                        f(v.get("side_stream_ms")),
                        f(v.get("h2d_ms_cap6"))
                        + (f" ({v['h2d_bytes_cap6'] / 1e9:.2f} GB)" if "h2d_bytes_cap6" in v else ""),
                    ]
                )
            )
        lines += [""]
    if "table2" in res:
        T = res["table2"]["rows"]
        lines += [
            "## Table 2 — fetch-ratio sweep",
            "",
            "What the paper's Table 2 workload is, DESIGN.md does not say (context, batch). The simulator's "
            "synthetic selection is *calibrated on this very table under an assumption*: "
            "`oasis_core/synthetic.py` derives `drift_rate = 0.11` from fetch-all = 5.05 GB per step by "
            "*assuming batch 128* and 8 KiB per (block, head, layer) (16.7 blocks per row per step); the "
            "ratio-0.01 point (1 block per row, 0.30 GB) supports the same batch. So the sweep here is: 16K "
            f"prompts, {res['options']['output_tokens']} outputs, closed loop at concurrency 128, lookahead. "
            "Two consequences: the bytes column is partly an input, not a prediction (agreement there checks "
            "the calibration and the batch, not the model), and the simulated batch is what HBM admits, "
            "not 128 — so bytes are also shown scaled to batch 128. Bytes per step = median over pure-decode "
            "steps (steady state); tok/s and PCIe GB/s = sums over those steps.",
            "",
            _row(
                [
                    "fetch ratio",
                    "cap blocks/row",
                    "paper GB/step",
                    "sim GB/step (batch)",
                    "sim GB/step ×128/batch",
                    "%",
                    "paper tok/s",
                    "sim tok/s",
                    "%",
                    "sim step ms",
                    "sim PCIe GB/s",
                    "resident recall",
                ]
            ),
            _row(["---"] * 12),
        ]
        for r in T:
            ratio = r["fetch_ratio"]
            pb, pt = PAPER_TABLE2.get(ratio, (None, None))
            cap = "all" if ratio >= 1 else str(int(np.floor(ratio * 128 + 0.5)))
            lines.append(
                _row(
                    [
                        "all" if ratio >= 1 else f"{ratio:g}",
                        cap,
                        f(pb and pb / 1e9, 2),
                        f"{r['h2d_bytes_per_decode_step_p50'] / 1e9:.2f} ({r['decode_batch']:.0f})",
                        f(r["h2d_bytes_per_step_at_128"] / 1e9, 2),
                        P(d(r["h2d_bytes_per_step_at_128"], pb)),
                        f(pt, 0),
                        f(r["decode_tok_s"], 0),
                        P(d(r["decode_tok_s"], pt)),
                        f(r["decode_step_ms"]),
                        f(r["pcie_gb_s"]),
                        f(r["resident_recall"], 3),
                    ]
                )
            )
        lines += ["", "![Table 2](table2_fetch_ratio.png)", ""]
    if "fig14" in res:
        C = res["fig14"]["core"]
        S = res["fig14"]["sim"]
        steps = res["fig14"]["steps"]
        lines += [
            "## Fig. 14 — RPF transfer per request",
            "",
            "Computed with `oasis_core.rpf` directly: one request, all 36 layers × 8 KV heads, the synthetic "
            "generator's first predicted set handed off through `RemoteLedger.handoff` (granularity "
            "`block` = union over the heads of a layer, sent for every head; `head` = each head's own "
            "blocks) and priced with `handoff_bytes` (predicted blocks + local block + summaries of every "
            "block + 2 MiB draft state); then "
            f"{steps} decode steps of `plan_step` on the draft prediction, each step's fetched blocks asked "
            "of the ledger (`RemoteLedger.request`), uncapped and with the default cap (5% of K = 6 "
            "blocks/row/step).",
            "",
            "Columns: *block-union, KV only* = K+V of the handed-off blocks (predicted union + local block), "
            "without summaries and draft state; *block-union, all* adds the summaries of every block (1/16 "
            "of the KV) and the 2 MiB draft state, as DESIGN.md describes the hand-off; *per head, all* = "
            "granularity `head` with the same extras.",
            "",
            _row(
                [
                    "ctx",
                    "paper RPF GiB",
                    "sim block-union, KV only",
                    "%",
                    "sim block-union, all",
                    "%",
                    "sim per head, all",
                    "%",
                    "summaries GiB",
                    "union blocks per layer",
                    "paper full GiB",
                    "sim full GiB",
                    "%",
                    "reduction paper / union all / head all",
                ]
            ),
            _row(["---"] * 14),
        ]
        for ctx in (24576, 32768):
            c = C[str(ctx)]
            hb, hh = c["handoff_block"], c["handoff_head"]
            pr = PAPER_FIG14[ctx]
            kv = hb["blocks_gib"] + hb["local_gib"]
            lines.append(
                _row(
                    [
                        f"{ctx // 1024}K",
                        f(pr["rpf_gib"], 2),
                        f(kv, 2),
                        P(d(kv, pr["rpf_gib"])),
                        f(hb["total_gib"], 2),
                        P(d(hb["total_gib"], pr["rpf_gib"])),
                        f(hh["total_gib"], 2),
                        P(d(hh["total_gib"], pr["rpf_gib"])),
                        f(hb["summaries_gib"], 2),
                        f(hb["union_blocks_per_layer"], 0),
                        f(pr["full_gib"], 2),
                        f(hb["full_gib"], 2),
                        P(d(hb["full_gib"], pr["full_gib"])),
                        f"{pr['full_gib'] / pr['rpf_gib']:.1f}× / {hb['reduction']:.1f}× / {hh['reduction']:.1f}×",
                    ]
                )
            )
        lines += [
            "",
            f"Drift: remote bytes fetched after the hand-off over {steps} output tokens "
            "(paper: 2.03–2.53 GiB uncapped, 1.61 GiB with the cap, over 2,048 tokens):",
            "",
            _row(
                [
                    "ctx",
                    "hand-off granularity",
                    "sim uncapped GiB",
                    "% vs 2.03–2.53",
                    "sim capped GiB",
                    "% vs 1.61",
                    "host→GPU GiB (capped)",
                ]
            ),
            _row(["---"] * 7),
        ]
        for ctx in (24576, 32768):
            c = C[str(ctx)]
            u, k = c["drift_uncapped"]["remote_gib"], c["drift_capped"]["remote_gib"]
            lo, hi = PAPER_DRIFT["uncapped_gib"]
            mid = lo if ctx == 24576 else hi
            lines.append(
                _row(
                    [
                        f"{ctx // 1024}K",
                        "block union",
                        f(u, 2),
                        P(d(u, mid)) + f" (vs {mid})",
                        f(k, 2),
                        P(d(k, PAPER_DRIFT["capped_gib"])),
                        f(c["drift_capped"]["h2d_gib"], 2),
                    ]
                )
            )
            if "drift_uncapped_after_head" in c:
                u, k = c["drift_uncapped_after_head"]["remote_gib"], c["drift_capped_after_head"]["remote_gib"]
                lines.append(
                    _row(
                        [
                            f"{ctx // 1024}K",
                            "per head",
                            f(u, 2),
                            P(d(u, mid)) + f" (vs {mid})",
                            f(k, 2),
                            P(d(k, PAPER_DRIFT["capped_gib"])),
                            f(c["drift_capped_after_head"]["h2d_gib"], 2),
                        ]
                    )
                )
        nov = res["fig14"].get("novelty")
        if nov:
            lo, hi = PAPER_DRIFT["uncapped_gib"]
            rate = nov["chosen"]
            tried = ", ".join(f"{g['novelty_rate']:g}" for g in nov["grid"])
            lines += [
                "",
                "With novelty (`SyntheticParams.novelty_rate`, opt-in, default 0 = the rows above): a slow "
                "inflow of blocks a row never selected, drawn from beyond the near-miss window. **Calibrated** "
                f"on the paper's *uncapped* drift at 24K (block-union hand-off, {nov['steps']} output tokens; "
                f"values tried {tried}; picked "
                f"the one nearest the middle of {lo}–{hi} GiB, {nov['target_gib']:.2f} GiB): "
                f"`novelty_rate = {rate:g}` never-seen blocks per row per step. The *capped* drift is then a "
                "**held-out prediction** against the paper's 1.61 GiB (nothing was fitted to it).",
                "",
                _row(
                    [
                        "novelty_rate",
                        "ctx",
                        "sim uncapped GiB",
                        "vs paper 2.03–2.53",
                        "sim capped GiB",
                        "% vs 1.61 (held out)",
                        "capped / uncapped (paper 0.64–0.79)",
                        "role",
                    ]
                ),
                _row(["---"] * 8),
            ]
            for g in nov["grid"]:
                u = g["uncapped_gib"]
                inside = "inside" if lo <= u <= hi else ("below" if u < lo else "above")
                lines.append(
                    _row(
                        [
                            f"{g['novelty_rate']:g}",
                            "24K",
                            f(u, 2),
                            inside,
                            "–",
                            "–",
                            "–",
                            "calibration (chosen)" if g["novelty_rate"] == rate else "calibration",
                        ]
                    )
                )
            for ctx in ("24576", "32768"):
                pv = nov["predicted"][ctx]
                u, k = pv["uncapped"]["remote_gib"], pv["capped"]["remote_gib"]
                inside = "inside" if lo <= u <= hi else ("below" if u < lo else "above")
                lines.append(
                    _row(
                        [
                            f"{rate:g}",
                            f"{int(ctx) // 1024}K",
                            f(u, 2),
                            inside + (" (fitted)" if ctx == "24576" else " (held out)"),
                            f(k, 2),
                            P(d(k, PAPER_DRIFT["capped_gib"])),
                            f(k / u, 2),
                            "prediction" if ctx != "24576" else "prediction (capped only)",
                        ]
                    )
                )
            for m in res.get("merged", []):
                if m["part"] == "fig14-novelty":
                    lines += [
                        "",
                        "(Novelty rows added by `--parts fig14-novelty` at commit "
                        f"`{m['provenance']['commit']}`, sources sha256 "
                        f"`{m['provenance'].get('sim_source_sha256', '?')}`, {m['wall_s']} s; "
                        "the other rows are unchanged by it: novelty_rate = 0 is bit-identical.)",
                    ]
        lines += [
            "",
            "Cross-check with the simulator's split modes (4 such requests, `split=full|rpf`, "
            f"{steps} output tokens, NIC `roce-400g`): per request, GiB.",
            "",
            _row(["ctx", "split", "policy sampling", "hand-off GiB", "network GiB total", "TTFT p50 ms"]),
            _row(["---"] * 6),
        ]
        for key, v in S.items():
            ctx, split, samp = key.split("_")
            lines.append(
                _row(
                    [
                        f"{int(ctx) // 1024}K",
                        split,
                        samp,
                        f(v["handoff_gib_per_req"], 2),
                        f(v["net_gib_per_req"], 2),
                        f(v["ttft_ms_p50"], 0),
                    ]
                )
            )
        lines += ["", "![Fig. 14](fig14_rpf.png)", ""]
    notes = Path(__file__).resolve().parent / "paper_repro_notes.md"
    if notes.is_file():
        lines += [notes.read_text().rstrip(), ""]
    (outdir / "sim_paper_repro.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
