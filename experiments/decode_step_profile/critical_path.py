"""Where a CUDA-graph decode step's main stream waits: its idle gaps inside the graph and what ends each one.

    python experiments/decode_step_profile/critical_path.py TRACE.json.gz [TRACE ...] [--out FILE.jsonl]

Reads Chrome traces saved by ``step_profile.py --trace-out`` (one or more profiled steps, each one graph replay).
Per step, from the kernels of its graph replay (same correlation id as the ``cudaGraphLaunch``):

- the *main* stream is the one with the most GEMM time (the layers' projections run there);
- ``span``: first kernel start to last kernel end; ``main_busy``: the union of the main stream's kernels;
- ``head`` / ``tail``: span start to main's first kernel, main's last kernel end to span end (a tail is side-stream
  work the graph joins before it ends: the last layers' prediction, plan and copies);
- inner gaps (> ``--min-gap-us``): main idle between two of its kernels. Each is charged to the side-stream kernel
  that ended last before main resumed (the release it most likely waited for), by kernel name;
- ``main_with_copy``: how much of the main stream's busy time ran while a UVA gather ran beside it.

A gap can also be the dependency edge's own latency (a few µs each); the per-name sums say which waits matter.

Caveat (seen on the H200, traces_16 at 319a24f): a replay runs the graph's branches on the driver's streams, and
the step's own chain does not stay on one of them. Its first ~60 µs (index and elementwise setup) and a few GEMMs
ran on the stream that also ran plan_select and the gather. So ``head`` and the gaps are upper bounds on the
main chain's waits. Two figures do not depend on the streams: ``layer_period_us`` (the mean spacing of the
layers' ``sparse_attn`` starts) and ``first_gemm_us`` (span start to the first GEMM).

Between two graphs (``to_next_graph``, every graph but the last): the GPU time from one graph's last kernel to the
next one's first, and the kernels outside any graph in it. In a decode chain (``step_profile.py --decode-chain``)
that is the eager work between two passes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_profile import _union, kernel_category, load_trace_events  # noqa: E402


def _short(name: str) -> str:
    return name.split("(")[0].split("<")[0].replace("void ", "").strip()[:60]


def graph_steps(events):
    """[(correlation, [(name, stream, t0, t1)])] for every graph launch with kernels, in launch order."""
    launches = sorted(
        (e for e in events if e.get("ph") == "X" and "GraphLaunch" in e.get("name", "") and "dur" in e),
        key=lambda e: e["ts"],
    )
    by_corr = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            a = e.get("args") or {}
            by_corr[a.get("correlation")].append(
                (e["name"], a.get("stream", e.get("tid")), e["ts"], e["ts"] + e["dur"])
            )
    out = []
    for g in launches:
        c = (g.get("args") or {}).get("correlation")
        if by_corr.get(c):
            out.append((c, sorted(by_corr[c], key=lambda k: k[2])))
    return out


def _merge(intervals):
    """Sorted, merged [start, end] lists of (start, end) intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def analyse_step(ks, min_gap_us=2.0):
    gemm_t = defaultdict(float)
    for n, s, a, b in ks:
        if kernel_category(n) == "gemm":
            gemm_t[s] += b - a
    main = max(gemm_t, key=gemm_t.get) if gemm_t else ks[0][1]
    mk = [k for k in ks if k[1] == main]
    side = [k for k in ks if k[1] != main]
    t0, t1 = min(k[2] for k in ks), max(k[3] for k in ks)
    merged = _merge((a, b) for _, _, a, b in mk)  # main's busy intervals; its gaps between them
    gaps = [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)]
    charged = defaultdict(lambda: [0, 0.0])
    small = 0.0
    for a, b in gaps:
        if b - a <= min_gap_us:
            small += b - a
            continue
        ended = [k for k in side if a - 1.0 <= k[3] <= b + 0.5]
        who = _short(max(ended, key=lambda k: k[3])[0]) if ended else "(no side kernel ended: host or edge)"
        charged[who][0] += 1
        charged[who][1] += b - a
    with_copy = 0.0
    for c0, c1 in _merge((a, b) for n, _, a, b in side if "uva_gather" in n):
        for a, b in merged:
            with_copy += max(0.0, min(b, c1) - max(a, c0))
    att = sorted(a for n, _, a, _ in ks if "sparse_attn" in n or "paged_attn" in n)
    period = (att[-1] - att[0]) / (len(att) - 1) if len(att) > 1 else None
    gemm_starts = [a for n, _, a, _ in ks if kernel_category(n) == "gemm"]
    side_by_name = defaultdict(float)
    for n, _, a, b in side:
        side_by_name[_short(n)] += b - a
    ms = lambda us: round(us / 1e3, 4)  # noqa: E731
    return {
        "kernels": len(ks),
        "main_stream": main,
        "span_ms": ms(t1 - t0),
        "busy_union_ms": ms(_union([(a, b) for _, _, a, b in ks])),
        "main_busy_ms": ms(sum(b - a for a, b in merged)),
        "head_ms": ms(merged[0][0] - t0),
        "tail_ms": ms(t1 - merged[-1][1]),
        "tail_kernels": sorted({_short(k[0]) for k in side if k[3] > merged[-1][1]}),
        "inner_gap_ms": ms(sum(b - a for a, b in gaps)),
        "small_gaps_ms": ms(small),
        "gaps_charged": {w: {"n": v[0], "ms": ms(v[1])} for w, v in sorted(charged.items(), key=lambda kv: -kv[1][1])},
        "main_with_copy_ms": ms(with_copy),
        "layer_period_us": round(period, 1) if period is not None else None,
        "first_gemm_us": round(min(gemm_starts) - t0, 1) if gemm_starts else None,
        "side_kernel_ms": {n: ms(t) for n, t in sorted(side_by_name.items(), key=lambda kv: -kv[1])[:12]},
    }


def between_graphs(steps, events):
    """For each graph but the last: the GPU time from its last kernel's end to the next graph's first kernel, and
    the kernels outside any graph that ran in it (a decode chain's eager work between two passes: the greedy pick,
    the draft head, the synthetic sets)."""
    in_graph = {c for c, _ in steps}
    eager = [
        (e["name"], e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        and (e.get("args") or {}).get("correlation") not in in_graph
    ]
    out = []
    for (_, a), (_, b) in zip(steps, steps[1:]):
        lo, hi = max(k[3] for k in a), min(k[2] for k in b)
        ks = [k for k in eager if k[2] > lo and k[1] < hi]
        names = defaultdict(float)
        for n, t0, t1 in ks:
            names[_short(n)] += min(t1, hi) - max(t0, lo)
        out.append(
            {
                "gap_ms": round((hi - lo) / 1e3, 4),
                "eager_kernels": len(ks),
                "eager_busy_ms": round(
                    sum(b_ - a_ for a_, b_ in _merge((max(t0, lo), min(t1, hi)) for _, t0, t1 in ks)) / 1e3, 4
                ),
                "eager_top": {n: round(t / 1e3, 4) for n, t in sorted(names.items(), key=lambda kv: -kv[1])[:5]},
            }
        )
    return out


def analyse(path, min_gap_us=2.0):
    events = load_trace_events(path)
    steps = graph_steps(events)
    if not steps:
        raise SystemExit(f"{path}: no graph launch with kernels (profile with CUDA graphs and --trace-out)")
    recs = [analyse_step(ks, min_gap_us) for _, ks in steps]
    for r, g in zip(recs, between_graphs(steps, events)):
        r["to_next_graph"] = g
    return {"trace": os.path.basename(path), "steps": recs}


def print_report(rec, out=None):
    out = out or sys.stdout
    print(f"== {rec['trace']}: {len(rec['steps'])} graph step(s)", file=out)
    for i, s in enumerate(rec["steps"]):
        print(
            f"step {i}: span {s['span_ms']} ms, busy {s['busy_union_ms']}, main busy {s['main_busy_ms']} "
            f"(with a copy beside it {s['main_with_copy_ms']}), head {s['head_ms']}, inner gaps {s['inner_gap_ms']} "
            f"(<= 2 us each: {s['small_gaps_ms']}), tail {s['tail_ms']} [{', '.join(s['tail_kernels'][:6])}]; "
            f"layer period {s['layer_period_us']} us, first GEMM at {s['first_gemm_us']} us",
            file=out,
        )
        for w, v in list(s["gaps_charged"].items())[:8]:
            print(f"    gap before main resumed, after {w:<60} n={v['n']:<4} {v['ms']:.3f} ms", file=out)
        g = s.get("to_next_graph")
        if g:
            top = ", ".join(f"{n} {t}" for n, t in g["eager_top"].items())
            print(
                f"    to the next graph: {g['gap_ms']} ms, {g['eager_kernels']} kernels outside graphs busy "
                f"{g['eager_busy_ms']} ms [{top}]",
                file=out,
            )
    last = rec["steps"][-1]
    print(
        "  side-stream kernel time (last step): " + ", ".join(f"{n} {t}" for n, t in last["side_kernel_ms"].items()),
        file=out,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--min-gap-us", type=float, default=2.0)
    ap.add_argument("--out", default=None, help="append one JSON record per trace")
    a = ap.parse_args(argv)
    for p in a.traces:
        rec = analyse(p, a.min_gap_us)
        print_report(rec)
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
