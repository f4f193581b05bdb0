"""Synthetic selections true to real ones, on the quantity the victim cache lives on: blocks fetched a row a step at
S = K, 2K, 3K slots (issue 37, item "synthetic selections").

Real: a ``quality selection`` JSON run with ``--policies unlimited --slots-ratio 1 2 3`` (every missing predicted
block fetched; ``fetch_late``: the second half of the P steps, after the warm-up), per result (text, context, K) and
prediction source (``lookahead`` = the ``--policy-draft`` draft's query through the resident set). Synthetic: the
generator (``oasis_core.synthetic.SyntheticSelection``) at the same rows (reported layers x KV heads), blocks, K and
steps, with the parameters of a preset (``--preset``: ``oasis_core.synthetic_presets``) or of the JSON's own fit
(``fit:<draft>``: the average's ``fit``), its ``draft`` prediction replayed by the same ``replay_policy`` from its
first ``current()`` set. Savings at S = R * K: 1 - fetch(S) / fetch(K). The check: each synthetic saving within 10%
(relative) of the real one.

    python experiments/long_context_draft/synthetic_vs_real.py SELECTION.json --preset smollm2 fit:eagle3_attn
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE))]

from oasis_core.fetchcap import get_policy  # noqa: E402
from oasis_core.synthetic import SyntheticParams, SyntheticSelection  # noqa: E402
from oasis_core.synthetic_presets import resolve  # noqa: E402
from oasis_exec.tools.quality.selection import PolicyLink, replay_policy  # noqa: E402


def real_fetch(result: dict, source: str = "lookahead") -> dict:
    """{ratio: mean blocks fetched a row a step over the second half of the steps} of one result (policy unlimited)."""
    by = result["policies"]["by_slots_ratio"]
    return {float(r): by[r]["unlimited"][source]["fetch_late"] for r in by}


def synthetic_fetch(params: SyntheticParams, rows: int, layers: int, kv_heads: int, n_blocks: int, k: int,
                    steps: int, ratios, seed: int = 0) -> dict:  # fmt: skip
    sel = SyntheticSelection(rows, n_blocks, k, params, seed, layers=layers, kv_heads=kv_heads)
    initial = np.asarray(sel.current())
    preds = np.stack([np.asarray(sel.step().draft) for _ in range(steps)])
    out = {}
    for r in ratios:
        _, fetch, _ = replay_policy(get_policy("unlimited"), initial, preds, layers, PolicyLink(), int(round(r * k)))
        out[float(r)] = float(np.asarray(fetch)[steps // 2 :].mean())
    return out


def savings(f: dict) -> dict:
    return {r: 1 - v / f[1.0] if f[1.0] else 0.0 for r, v in f.items() if r != 1.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("selection", help="quality selection JSON with --policies unlimited --slots-ratio 1 2 3")
    ap.add_argument("--preset", nargs="+", default=["smollm2"], help="preset names, or fit:<draft> (the JSON's fit)")
    ap.add_argument("--tolerance", type=float, default=0.10, help="relative tolerance on each saving")
    ap.add_argument("--seeds", type=int, default=1, help="generator seeds averaged (few rows, e.g. Gemma's 3: use 8)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    doc = json.load(open(a.selection))
    layers = len(doc["setup"].get("report_layers") or []) or doc["weights"]["layers_used"]
    hkv = doc["weights"]["kv_heads"]
    rows_out, ok_all = [], True
    for key, avg in doc["average"].items():
        grp = [
            r for r in doc["results"]
            if r["n_tokens_requested"] == avg["n_tokens_requested"] and r["k"] == avg["k"] and "policies" in r
        ]  # fmt: skip
        if not grp:
            continue
        real = {rt: float(np.mean([real_fetch(r)[rt] for r in grp])) for rt in real_fetch(grp[0])}
        for name in a.preset:
            if name.startswith("fit:"):
                params = SyntheticParams(**avg["fit"][name[4:]]["params"])
            else:
                params = resolve({"preset": name})
            syn = {}
            for r in grp:
                for seed in range(a.seeds):
                    f = synthetic_fetch(
                        params, layers * hkv, layers, hkv, r["n_blocks"], r["k"], doc["setup"]["positions"], real, seed
                    )
                    for rt, v in f.items():
                        syn[rt] = syn.get(rt, 0.0) + v / len(grp) / a.seeds
            rs, ss = savings(real), savings(syn)
            ok = all(abs(ss[rt] - rs[rt]) <= a.tolerance * abs(rs[rt]) for rt in rs)
            ok_all &= ok
            rows_out.append({"group": key, "preset": name, "real_fetch": real, "synthetic_fetch": syn,
                             "real_savings": rs, "synthetic_savings": ss, "within_tolerance": ok})  # fmt: skip
            cells = "  ".join(f"S={rt:g}K real {100 * rs[rt]:5.1f}% syn {100 * ss[rt]:5.1f}%" for rt in sorted(rs))
            print(f"{key:>12} {name:>18}: fetch at S=K real {real[1.0]:.2f} syn {syn[1.0]:.2f} | {cells} | "
                  f"{'ok' if ok else 'MISS'}")  # fmt: skip
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"selection": os.path.basename(a.selection), "tolerance": a.tolerance, "seeds": a.seeds,
                       "rows": rows_out}, fh,
                      indent=1)  # fmt: skip
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
