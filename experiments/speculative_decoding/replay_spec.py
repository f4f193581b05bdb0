"""Speculative executor recordings replayed in the simulator with the same acceptance; and the simulator's own
figures at their shape for other draft lengths, with the real model's measured acceptance.

    python experiments/speculative_decoding/replay_spec.py RECORDING ... [--calibrate-from DIR ...]
        [--accept-from results/spec_cpu.jsonl] [--what-if-k 0 1 2 3 auto:3] [--out results/replay_qwen]

**Replay** (``oasis_sim.validate.validate``, held-out): each recording (``bench --record``; a speculative one
carries ``speculative_k`` and ``results.accepted_hist``, which the replay draws every request-step's accepted drafts
from, ``acceptance`` saying whether the executor's came from the model or, benchmark only, from
``--synthetic-accept`` draws) is simulated with its configuration, by the roofline and by the predictor fitted on
``--calibrate-from`` (default: the fused-kernel H200 recordings, ``traces/recordings_fused``, none speculative: the
speculative step is predicted from the ordinary step's calibration). Reported: measured and predicted tok/s
(emitted tokens), step time p50, TPOT (step time / tokens a step) and tokens a step, with the errors.

**What if** (``--what-if-k``): the first recording without speculation (else the first) replayed with each draft
length, its acceptance the real model's (``--accept-from``: the study's records, mode and draft length matching,
the longest context's ``accepted_hist``, or ``--accept-context``'s; ``auto:N`` draws from the chain rate pooled over them): the simulator at the
recording's shape with the measured acceptance, where no executor ran. A row whose draft length has a recording
too names it (the executor beside the simulator).

Writes ``OUT.md`` and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core.speculation import parse_spec  # noqa: E402
from oasis_sim.replay import replay  # noqa: E402
from oasis_sim.validate import err_pct, load_all, validate  # noqa: E402


def tokens_per_step(result) -> float:
    """Simulated tokens a request emits a step over the replay's window."""
    steps = result.sim.steps
    n = result.recording.config["concurrency"]
    return sum(steps.emitted[i] for i in result.window) / (n * len(result.window))


def measured_tokens_per_step(rec) -> float:
    return float(rec.results.get("accepted_tokens_per_step") or 1.0)


def _k_of(v) -> int:
    return parse_spec(v or 0)[0]


def study_hists(path: str, mode: str, context: int | None = None) -> dict:
    """speculative_k -> accepted_hist of the study's records of ``mode`` (at ``context``; None: the longest)."""
    best = {}
    for line in open(path):
        r = json.loads(line)
        if r["mode"] != mode or not r.get("accepted_hist") or (r.get("acceptance") or "model") != "model":
            continue
        if context is not None and r["context"] != context:
            continue
        k = r["speculative_k"]
        if k not in best or r["context"] > best[k]["context"]:
            best[k] = r
    return {k: r["accepted_hist"] for k, r in best.items()}


def pooled_hist(hists: dict) -> dict:
    """Every fixed-k histogram of ``hists`` merged (``position_rates`` reads each length's own counts)."""
    out = {}
    for k, h in hists.items():
        if isinstance(k, int):
            for kk, v in h.items():
                out[kk] = [a + b for a, b in zip(out.get(kk, [0] * len(v)), v)]
    return out


def replay_rows(recs, calibrate) -> list:
    rep = validate(recs, calibrate_from=calibrate)
    rows = []
    for i, rec in enumerate(recs):
        row = {
            "recording": rec.name,
            "mode": rec.config["mode"],
            "context": rec.config["context"],
            "concurrency": rec.config["concurrency"],
            "speculative_k": rec.config.get("speculative_k", 0),
            "acceptance": rec.config.get("acceptance"),
            "accepted_hist": rec.results.get("accepted_hist"),
            "tokens_per_step": {"measured": measured_tokens_per_step(rec)},
            "device": rec.results["device"],
            "commit": rec.results["commit"],
        }
        for p in ("roofline", "fitted"):
            m = rep["predictors"][p]["recordings"][i]["metrics"]
            row[p] = {k: m[k] for k in ("throughput_tok_s", "tpot_ms_p50") if k in m}
        res = replay(rec)  # the roofline's run again, for its emitted tokens a step (the acceptance drawn)
        row["tokens_per_step"]["simulated"] = tokens_per_step(res)
        row["tokens_per_step"]["err_pct"] = err_pct(
            row["tokens_per_step"]["measured"], row["tokens_per_step"]["simulated"]
        )
        rows.append(row)
    return rows


def what_if(recs, calibrate, ks, hists, spec_predict="after") -> list:
    """The simulator at the base recording's shape for each draft length of ``ks``, acceptance from ``hists``, its
    speculative lookahead steps predicting ``spec_predict`` the pass (after, or beside: ``oasis_sim.spec_pipeline``)."""
    from oasis_sim.fitted import fit, recording_key, sample_of

    base = next((r for r in recs if not r.config.get("speculative_k")), recs[0])
    scored = {recording_key(r) for r in recs}
    pool = [r for r in calibrate if recording_key(r) not in scored]  # held out: none of the compared recordings
    model = fit([sample_of(r, replay(r)) for r in pool]) if pool else None
    by_k = {}
    for r in recs:  # the first recording of each k (list the graphed k = 0 before an eager one)
        by_k.setdefault(str(r.config.get("speculative_k", 0)), r)
    rows = []
    for k in ks:
        kk = int(k) if str(k).isdigit() else k
        cfg = dict(base.config)
        cfg.pop("speculative_k", None)
        cfg.pop("speculative_gamma", None)
        results = dict(base.results)
        results.pop("accepted_hist", None)
        hist = None
        if _k_of(kk):
            cfg["speculative_k"] = kk
            hist = hists.get(kk) if isinstance(kk, int) else pooled_hist(hists)
            if not hist:
                rows.append({"speculative_k": kk, "error": "no measured acceptance for this k"})
                continue
            results["accepted_hist"] = hist
            if spec_predict != "after":
                cfg["spec_predict"] = spec_predict
        rec = dataclasses.replace(base, trace=dataclasses.replace(base.trace, config=cfg, results=results))
        row = {"speculative_k": kk, "accepted_hist": hist, "base": base.name, "spec_predict": spec_predict}
        for name, pred in (("roofline", None), ("fitted", model.predictor_for(rec) if model else None)):
            if name == "fitted" and pred is None:
                continue
            res = replay(rec, pred)
            row[name] = {
                "throughput_tok_s": res.predicted["throughput_tok_s"],
                "tpot_ms_p50": res.predicted["tpot_ms_p50"],  # a step's time over the tokens it gave a request
                "tokens_per_step": tokens_per_step(res),
            }
        ex = by_k.get(str(kk))
        if ex is not None:
            row["executor"] = {
                "recording": ex.name,
                "throughput_tok_s": ex.results["throughput_tok_s"],
                "tpot_ms_p50": ex.results["tpot_ms_p50"],
                "tokens_per_step": measured_tokens_per_step(ex),
            }
        rows.append(row)
    return rows


def _f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)


def _e(x):
    return "-" if x is None else f"{x:+.1f}%"


def markdown(rows, whatif, calib_names, accept_from) -> str:
    out = [
        "# Speculative decoding: executor recordings replayed in the simulator\n",
        f"Fitted predictor calibrated on {len(calib_names)} recordings (held out: none of them is scored). "
        "Replays draw each request-step's accepted drafts from the recording's `accepted_hist`.\n",
        "| recording | mode | ctx × n | k | acceptance | tokens/step meas / sim | tok/s meas | roofline | err | "
        "fitted | err | TPOT p50 ms meas | roofline | err | fitted | err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        tp = r["tokens_per_step"]
        ro, fi = r["roofline"], r.get("fitted", {})
        thr_r, thr_f = ro.get("throughput_tok_s", {}), fi.get("throughput_tok_s", {})
        tp_r, tp_f = ro.get("tpot_ms_p50", {}), fi.get("tpot_ms_p50", {})
        out.append(
            f"| {r['recording']} | {r['mode']} | {r['context']} × {r['concurrency']} | {r['speculative_k']} | "
            f"{r['acceptance'] or '-'} | {tp['measured']:.2f} / {tp['simulated']:.2f} | "
            f"{_f(thr_r.get('measured'))} | {_f(thr_r.get('predicted'))} | {_e(thr_r.get('err_pct'))} | "
            f"{_f(thr_f.get('predicted'))} | {_e(thr_f.get('err_pct'))} | {_f(tp_r.get('measured'), '{:.2f}')} | "
            f"{_f(tp_r.get('predicted'), '{:.2f}')} | {_e(tp_r.get('err_pct'))} | {_f(tp_f.get('predicted'), '{:.2f}')} | "
            f"{_e(tp_f.get('err_pct'))} |"
        )
    if whatif:
        out += [
            "",
            f"## What if: the simulator at `{whatif[0].get('base')}`'s shape, acceptance measured on the real model "
            f"({accept_from})\n",
            "| k | prediction | accepted hist | sim tokens/step | roofline tok/s | fitted tok/s | fitted TPOT p50 ms | "
            "executor (recording: tok/s, TPOT p50 ms, tokens/step) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for w in whatif:
            if "error" in w:
                out.append(f"| {w['speculative_k']} | {w.get('spec_predict', 'after')} | {w['error']} | | | | | |")
                continue
            ro, fi, ex = w["roofline"], w.get("fitted", {}), w.get("executor")
            exs = (
                "-"
                if ex is None
                else (
                    f"{ex['recording']}: {ex['throughput_tok_s']:.1f}, {ex['tpot_ms_p50']:.2f}, {ex['tokens_per_step']:.2f}"
                )
            )
            out.append(
                f"| {w['speculative_k']} | {w.get('spec_predict', 'after') if _k_of(w['speculative_k']) else '-'} | "
                f"{json.dumps(w['accepted_hist']) if w['accepted_hist'] else '-'} | "
                f"{ro['tokens_per_step']:.2f} | {ro['throughput_tok_s']:.1f} | {_f(fi.get('throughput_tok_s'))} | "
                f"{_f(fi.get('tpot_ms_p50'), '{:.2f}')} | {exs} |"
            )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recordings", nargs="+", help="recording files or directories")
    ap.add_argument("--calibrate-from", nargs="*", default=[os.path.join(REPO, "traces", "recordings_fused")])
    ap.add_argument("--accept-from", default=os.path.join(HERE, "results", "spec_cpu.jsonl"))
    ap.add_argument(
        "--accept-mode", default=None, help="the study's mode to take acceptance from (default: the base's)"
    )
    ap.add_argument("--accept-context", type=int, default=None, help="the study's context (default: the longest)")
    ap.add_argument("--what-if-k", nargs="*", default=["0", "1", "2", "3", "auto:3"])
    ap.add_argument(
        "--spec-predict", nargs="+", default=["after"], choices=("after", "beside"), help="what-if variants"
    )
    ap.add_argument("--out", default=os.path.join(HERE, "results", "replay_qwen"))
    a = ap.parse_args(argv)
    recs = load_all(a.recordings)
    calib = load_all(a.calibrate_from) if a.calibrate_from else []
    rows = replay_rows(recs, calib or None)
    whatif = []
    if a.what_if_k:
        mode = a.accept_mode or recs[0].config["mode"]
        hists = study_hists(a.accept_from, mode, a.accept_context)
        whatif = [w for v in a.spec_predict for w in what_if(recs, calib, a.what_if_k, hists, v)]
    md = markdown(rows, whatif, [r.name for r in calib], os.path.relpath(a.accept_from, REPO))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)) or ".", exist_ok=True)
    with open(a.out + ".md", "w") as fh:
        fh.write(md)
    with open(a.out + ".json", "w") as fh:
        json.dump(
            {"replay": rows, "what_if": whatif, "calibration": [r.name for r in calib]}, fh, indent=1, default=str
        )
    print(md)
    print(f"wrote {a.out}.md, {a.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
