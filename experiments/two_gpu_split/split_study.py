"""Prefill/decode split with remote partial fetching (RPF) for real, against a full hand-off, and the simulator's
error on what it predicts of it (hand-off bytes, remote bytes, TTFT, decode-node host memory).

Part 1 (executor, CPU, real model): SmolLM2-135M (GGUF, fp32) with the trained draft head, lookahead, the model's
own selection; one prefill process and one decode process over gloo (``oasis_exec.tools.rpf_split``), ``--handoff rpf``
and ``full``; the decode node's greedy tokens checked against a one-process run (``--reference``).

Part 2 (simulator): the same request at the SmolLM2 shape with the fitted synthetic preset (``smollm2``), the NIC at
the link rate and latency part 1 measured; its figures against part 1's.

Part 3 (simulator / core planner, no model): the Qwen3-8B shape at 24K with the ``smollm2`` preset, hand-off and
2,048-token remote bytes, every layer's rows planned (``policy_layers`` 36, ``policy_sampling`` exact: the core's
``plan_step`` and ``RemoteLedger`` on every (layer, KV head) row) and the default two sampled layers, against the
paper's 0.52 vs 3.37 GiB.

    python experiments/two_gpu_split/split_study.py [--context 6016] [--decode 2048] [--top-k 32] [--reference]

writes ``results/split_study.json`` and ``results/split_study.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.common import reporting as common  # noqa: E402

HERE = Path(__file__).resolve().parent
GIB = common.GIB
TEXT = common.REPO / "traces" / "texts" / "argparse.py.txt"
DRAFT = common.REPO / "experiments" / "trained_draft_head" / "smollm2-eagle3"
PAPER_24K = {"handoff_gib": 0.52, "full_gib": 3.37}


def executor_runs(args) -> dict:
    from oasis_exec.config import ExecConfig
    from oasis_exec.model.gguf import sha256_file, smollm2_path
    from oasis_exec.server.tokenizer import load_tokenizer
    from oasis_exec.tools import rpf_split
    from oasis_exec.tools.tp_generate import generate_greedy

    model = smollm2_path()
    ids = load_tokenizer(model).encode(TEXT.read_text())[: args.context]
    if len(ids) < args.context:
        raise SystemExit(f"{TEXT} holds {len(ids)} tokens, fewer than --context {args.context}")
    cfg = ExecConfig(
        model_path=model,
        draft_path=str(DRAFT),
        device="cpu",
        dtype="float32",
        mode="lookahead",
        block_size=16,
        top_k=args.top_k,
        fetch_ratio=args.fetch_ratio,
        max_context=args.context + args.decode + 32,
        short_context=False,
        block_score="minmax_sum+sink",  # the hand-off sends no per-token channels (auto would be tokens for SmolLM2)
    )
    out = {
        "weights": f"real: {os.path.basename(model)} sha256 {sha256_file(model)[:16]}, fp32 on the CPU",
        "draft": f"{DRAFT.relative_to(common.REPO)} (trained head)",
        "selection": "model (the draft token's query against the real summaries)",
        "prompt": f"{TEXT.relative_to(common.REPO)}: first {args.context} tokens",
        "config": {"top_k": cfg.top_k, "block_size": cfg.block_size, "fetch_ratio": cfg.fetch_ratio},
    }
    for h in ("rpf", "full"):
        t0 = time.perf_counter()
        r = rpf_split.split_run(cfg, ids, args.decode, handoff=h)
        r["wall_s"] = time.perf_counter() - t0
        print(f"{h}: {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
        out[h] = r
    if args.reference:
        t0 = time.perf_counter()
        ref = generate_greedy(cfg, [ids], args.decode)["tokens"][0]
        out["reference_wall_s"] = time.perf_counter() - t0
        out["reference_tokens"] = ref
        for h in ("rpf", "full"):
            d = out[h]["decode"]["tokens"]
            out[h]["equal_to_one_process"] = d == ref
            out[h]["first_divergence"] = next((i for i, (a, b) in enumerate(zip(d, ref)) if a != b), None)
    return out


def summarize_exec(r: dict) -> dict:
    """The figures of one split run (bytes as the fp32 run moved them, and at bf16: half, the unit the simulator's
    geometry counts)."""
    d, p = r["decode"], r["prefill"]
    w = d["wire_bytes"]
    handoff = sum(w.get(k, 0) for k in ("meta+draft", "tables", "summaries", "local", "blocks"))
    remote = w.get("remote", 0)
    steps = d["remote_units_per_step"]
    cum, acc = {}, 0
    for i, n in enumerate(steps, 1):
        acc += n
        if i in (1, 64, 256, 1024, 2047) or i == len(steps):
            cum[str(i + 1)] = acc * d["unit_bytes"]  # tokens out (the prefill's first one included)
    return {
        "handoff_bytes": handoff,
        "handoff_parts": {k: w.get(k, 0) for k in ("blocks", "summaries", "local", "tables", "meta+draft")},
        "remote_bytes": remote,
        "remote_request_bytes": w.get("requests", 0),
        "remote_bytes_by_tokens_out": cum,
        "full_kv_bytes": d["full_kv_bytes"],
        "handoff_units": d["handoff_units"],
        "remote_units": d["remote_units"],
        "units_crossed_twice": p["units_crossed_twice"],
        "ledger_units_sent": d["ledger_units_sent"],
        "max_remote_units_per_row_step": d["max_remote_units_per_row_step"],
        "cap_units_per_row_step": d["cap_units_per_row_step"],
        "prefill_s": p["prefill_s"],
        "handoff_s": r["handoff_s"],
        "ttft_s": r["ttft_s"],
        "decode_s_per_token": d["decode_s"] / max(len(d["tokens"]) - 1, 1),
        "decode_host_kv_bytes": d["decode_host_kv_bytes"],
        "decode_host_arrived_bytes": handoff
        + remote
        + (d["decode_host_kv_bytes"] - d["ledger_units_sent"] * d["unit_bytes"]),
        "link": d["link"],
        "tokens_out": len(d["tokens"]),
        "equal_to_one_process": r.get("equal_to_one_process"),
    }


def one_request(prompt: int, output: int):
    from oasis_core.trace import Trace, TraceRequest

    return Trace(
        requests=[TraceRequest(id=0, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output)],
        meta={"source": "one request"},
    )


def sim(model, split, prompt, output, top_k, fetch_ratio, layers, preset="smollm2", **kw) -> dict:
    from oasis_sim.config import SimConfig
    from oasis_sim.sim import simulate

    cfg = SimConfig(
        model=model,
        hardware="h100-sxm",
        mode="lookahead",
        split=split,
        top_k=top_k,
        fetch_ratio=fetch_ratio,
        short_context=False,
        policy_sampling="exact",
        policy_layers=layers,
        synthetic={"preset": preset},
        timeline_steps=0,
        **kw,
    )
    t0 = time.perf_counter()
    s = simulate(cfg, one_request(prompt, output)).summary
    keys = (
        "handoff_bytes",
        "handoff_kv_bytes",
        "handoff_summary_bytes",
        "handoff_draft_bytes",
        "handoff_full_kv_bytes",
        "rpf_remote_bytes",
        "net_bytes",
        "ttft_ms_p50",
        "prefill_busy_s",
        "host_peak_bytes",
        "tpot_ms_p50",
    )
    out = {k: s.get(k) for k in keys}
    out["handoff_s"] = s["ttft_ms_p50"] / 1e3 - s["prefill_busy_s"]
    out["wall_s"] = time.perf_counter() - t0
    return out


def best_link(links) -> dict:
    """The link of several ping-pong probes (``rpf_split.measure_link``): each size's quickest round trip over all of
    them (other work on the two shared cores only ever slows a probe), then latency and rate as ``measure_link``
    derives them."""
    rtt = {n: min(x["rtt_s"][n] for x in links) for n in links[0]["rtt_s"]}
    small, big = min(rtt, key=int), max(rtt, key=int)
    rate = (int(big) - int(small)) / max(rtt[big] - rtt[small], 1e-9)
    return {"latency_s": rtt[small] / 2, "bytes_per_s": rate, "rtt_s": rtt, "from": "quickest of the runs' probes"}


def err(pred, meas):
    return None if not meas else (pred - meas) / meas


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=6016, help="prompt tokens (SmolLM2 holds 8,192 positions)")
    ap.add_argument("--decode", type=int, default=2048, help="tokens out, the prefill's first one included")
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--fetch-ratio", type=float, default=0.05)
    ap.add_argument("--reference", action="store_true", help="also a one-process run: the tokens must be equal")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--exec-from", help="reuse the executor part of an earlier run (its split_exec.json)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prov = common.provenance()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.exec_from:  # the executor part of an earlier run (its own provenance inside)
        ex = json.loads(Path(args.exec_from).read_text())
    else:
        ex = executor_runs(args)
        ex["provenance"] = prov
        (out / "split_exec.json").write_text(json.dumps(ex, indent=1, default=str) + "\n")  # kept before the rest
    figs = {h: summarize_exec(ex[h]) for h in ("rpf", "full")}
    link = best_link([figs[h]["link"] for h in ("rpf", "full")])
    half = 2  # fp32 -> bf16 bytes: every KV and summary byte halves (the simulator's geometry is bf16)
    sims = {}
    for h in ("rpf", "full"):
        sims[h] = sim(
            "smollm2-135m",
            h,
            args.context,
            args.decode,
            args.top_k,
            args.fetch_ratio,
            30,
            nic_bytes_per_s=link["bytes_per_s"] / half,  # the wire moved fp32: the same seconds for half the bytes
            nic_latency_s=link["latency_s"],
            draft_state_bytes=24.0,
        )
    rows = []
    for h in ("rpf", "full"):
        f, s = figs[h], sims[h]
        pred_handoff = s["handoff_bytes"] * half
        pred_remote = (s["rpf_remote_bytes"] or 0) * half
        pred_host = s["host_peak_bytes"] * half
        pred_ttft = f["prefill_s"] + s["handoff_s"]  # the CPU's prefill is measured; the simulator's is a GPU's
        rows.append(
            {
                "split": h,
                "handoff_bytes": (f["handoff_bytes"], pred_handoff, err(pred_handoff, f["handoff_bytes"])),
                "remote_bytes": (f["remote_bytes"], pred_remote, err(pred_remote, f["remote_bytes"])),
                "handoff_s": (f["handoff_s"], s["handoff_s"], err(s["handoff_s"], f["handoff_s"])),
                "ttft_s": (f["ttft_s"], pred_ttft, err(pred_ttft, f["ttft_s"])),
                "decode_host_bytes": (
                    f["decode_host_arrived_bytes"],
                    pred_host,
                    err(pred_host, f["decode_host_arrived_bytes"]),
                ),
            }
        )
    q = {}
    for name, split, layers, preset in (
        ("rpf_all_layers", "rpf", 36, "smollm2"),
        ("rpf_2_layers", "rpf", 2, "smollm2"),
        ("full", "full", 2, "smollm2"),
        ("rpf_all_layers_paper_preset", "rpf", 36, "paper"),
    ):
        q[name] = sim("qwen3-8b", split, 24576, 2048, 128, 0.05, layers, preset=preset)
        print(f"qwen3-8b {name}: {q[name]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    res = {
        "question": "RPF against a full hand-off, for real on two processes, and the simulator's error on it",
        "provenance": prov,
        "device": "CPU (two processes of this machine, gloo over loopback); no GPU",
        "executor": {k: v for k, v in ex.items() if k not in ("rpf", "full", "reference_tokens", "provenance")},
        "executor_provenance": ex.get("provenance"),
        "executor_figures": figs,
        "link": link,
        "simulator_smollm2": sims,
        "simulator_error": rows,
        "qwen3_8b_24k": q,
        "args": vars(args),
    }
    Path(args.out, "split_study.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    common.write_markdown(Path(args.out, "split_study.md"), report(res), HERE / "split_study_notes.md")
    print("\n".join(report(res)))
    return 0


def _g(x):
    return f"{x / GIB:.4f} GiB" if x is not None else "—"


def _pct(x):
    return f"{100 * x:+.1f}%" if x is not None else "—"


def report(res) -> list:
    ex, f, a = res["executor"], res["executor_figures"], res["args"]
    r, fu = f["rpf"], f["full"]
    link = res["link"]
    L = [
        "# RPF split for real: two processes, SmolLM2-135M; the simulator's error; the Qwen3-8B shape at 24K",
        "",
        "Simulator part: " + common.provenance_md(res["provenance"]),
        "Executor part (the two-process runs): "
        + common.provenance_md(res["executor_provenance"] or res["provenance"]),
        f"Device: {res['device']}. Weights: {ex['weights']}. Draft: {ex['draft']}. Selection: {ex['selection']}. "
        f"Prompt: {ex['prompt']}; {a['decode']} tokens out; top-K {a['top_k']} + the local block, block 16, fetch "
        f"ratio {a['fetch_ratio']} (cap: {r['cap_units_per_row_step']} units a row and step).",
        "",
        "## Executor: RPF against a full hand-off (fp32 bytes as moved)",
        "",
        "| figure | rpf | full |",
        "| --- | --- | --- |",
        f"| hand-off | {_g(r['handoff_bytes'])} | {_g(fu['handoff_bytes'])} |",
        "| of it: KV blocks / summaries / local block / maps / meta (B) | "
        + " / ".join(str(r["handoff_parts"][k]) for k in ("blocks", "summaries", "local", "tables", "meta+draft"))
        + " | "
        + " / ".join(str(fu["handoff_parts"][k]) for k in ("blocks", "summaries", "local", "tables", "meta+draft"))
        + " |",
        f"| remote KV over {r['tokens_out']} tokens out | {_g(r['remote_bytes'])} | {_g(fu['remote_bytes'])} |",
        f"| hand-off + remote | {_g(r['handoff_bytes'] + r['remote_bytes'])} | "
        f"{_g(fu['handoff_bytes'] + fu['remote_bytes'])} |",
        f"| the prompt's full KV | {_g(r['full_kv_bytes'])} | {_g(fu['full_kv_bytes'])} |",
        f"| units handed off / fetched later / crossed twice | {r['handoff_units']} / {r['remote_units']} / "
        f"{r['units_crossed_twice']} | {fu['handoff_units']} / {fu['remote_units']} / {fu['units_crossed_twice']} |",
        f"| most units a row fetched in one step (cap) | {r['max_remote_units_per_row_step']} "
        f"({r['cap_units_per_row_step']}) | {fu['max_remote_units_per_row_step']} |",
        f"| prefill / hand-off wire time / TTFT (s) | {r['prefill_s']:.2f} / {r['handoff_s']:.3f} / "
        f"{r['ttft_s']:.2f} | {fu['prefill_s']:.2f} / {fu['handoff_s']:.3f} / {fu['ttft_s']:.2f} |",
        f"| decode node's host KV at the end | {_g(r['decode_host_kv_bytes'])} | {_g(fu['decode_host_kv_bytes'])} |",
        f"| decode s a token (CPU) | {r['decode_s_per_token']:.3f} | {fu['decode_s_per_token']:.3f} |",
        f"| greedy tokens equal to one process | {r['equal_to_one_process']} | {fu['equal_to_one_process']} |",
        "",
        "Remote KV by tokens out (rpf): "
        + ", ".join(f"{k}: {_g(v)}" for k, v in r["remote_bytes_by_tokens_out"].items())
        + ".",
        "",
        f"Link (gloo send/recv over loopback; ping-pong after each run, the quickest round trips of both): "
        f"{link['bytes_per_s'] / 1e9:.2f} GB/s, latency {1e6 * link['latency_s']:.0f} us (each run's: "
        + "; ".join(
            f"{h} {f[h]['link']['bytes_per_s'] / 1e9:.2f} GB/s, {1e6 * f[h]['link']['latency_s']:.0f} us"
            for h in ("rpf", "full")
        )
        + ").",
        "",
        "## The simulator's error (SmolLM2 shape, synthetic `smollm2` preset, the NIC at the measured link)",
        "",
        "Bytes at the run's fp32 (the simulator's bf16 figures x 2). TTFT: the measured CPU prefill plus the "
        "simulated hand-off (the simulator's prefill time is an H100's). Decode-node host memory: what arrived "
        "(hand-off, remote) plus the KV decoded there, as the simulator counts it.",
        "",
        "| split | figure | measured | simulated | error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in res["simulator_error"]:
        for k in ("handoff_bytes", "remote_bytes", "handoff_s", "ttft_s", "decode_host_bytes"):
            m, p, e = row[k]
            fmt = (lambda x: f"{x:.3f} s") if k.endswith("_s") else _g
            L.append(f"| {row['split']} | {k} | {fmt(m)} | {fmt(p)} | {_pct(e)} |")
    q = res["qwen3_8b_24k"]
    L += [
        "",
        "## Qwen3-8B shape, 24K prompt, 2,048 tokens out, synthetic `smollm2` preset (simulator planner, no model)",
        "",
        "| run | hand-off | of it KV / summaries | remote over 2,048 tokens | full KV | TTFT (H100 prefill) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in q.items():
        L.append(
            f"| {name} | {_g(s['handoff_bytes'])} | {_g(s['handoff_kv_bytes'])} / {_g(s['handoff_summary_bytes'])} | "
            f"{_g(s['rpf_remote_bytes'])} | {_g(s['handoff_full_kv_bytes'])} | {s['ttft_ms_p50']:.0f} ms |"
        )
    L.append(f"| paper (Qwen3-8B, 24K) | {PAPER_24K['handoff_gib']} GiB | | | {PAPER_24K['full_gib']} GiB | |")
    return L


if __name__ == "__main__":
    sys.exit(main())
