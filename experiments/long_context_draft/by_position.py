"""Agreement against how far the generation has gone: a ``quality selection`` result file (with per-position figures,
2026-12-07 on) read in buckets of decode positions.

    python experiments/long_context_draft/by_position.py RESULT.json [RESULT.json ...] [--buckets 4]

Per file and K: for each bucket of the measured positions (1 = the first token the target generated), the proxy's
mean agreement with the next step's true top-K and, per draft, its agreement and token accuracy (%), averaged over
the texts and the reported layers; then each draft's gap to the oracle where the file has one.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def buckets(values, n: int) -> list:
    """Means of ``values`` over ``n`` consecutive equal (as near as can be) runs of positions."""
    return [float(np.mean(part)) for part in np.array_split(np.asarray(values, dtype=float), n)]


def table(doc: dict, n: int) -> str:
    lines = []
    for key, avg in doc["average"].items():
        if "proxy_per_position" not in avg:
            raise SystemExit(f"{key}: no per-position figures (a result from before 2026-12-07)")
        p = len(avg["proxy_per_position"])
        edges = [(int(c[0]) + 1, int(c[-1]) + 1) for c in np.array_split(np.arange(p), n)]
        drafts = avg["drafts"]
        lines.append(
            f"\n{key}, {len(avg['texts'])} texts, {doc.get('generation', '?')}: agreement % (token accuracy %)"
        )
        lines.append("| positions | proxy | " + " | ".join(drafts) + " |")
        lines.append("| --- " * (2 + len(drafts)) + "|")
        px = buckets(avg["proxy_per_position"], n)
        cols = {
            d: (buckets(f["sparse_per_position"], n), buckets(f["right_per_position"], n)) for d, f in drafts.items()
        }
        for i, (a, b) in enumerate(edges):
            cells = [f"{100 * cols[d][0][i]:.1f} ({100 * cols[d][1][i]:.0f})" for d in drafts]
            lines.append(f"| {a}-{b} | {100 * px[i]:.1f} | " + " | ".join(cells) + " |")
        if "oracle" in drafts:
            for d in drafts:
                if d != "oracle":
                    gap = [100 * (o - x) for o, x in zip(cols["oracle"][0], cols[d][0])]
                    lines.append(f"{d} below the oracle, points by bucket: " + ", ".join(f"{g:.1f}" for g in gap))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--buckets", type=int, default=4)
    a = ap.parse_args(argv)
    for path in a.results:
        with open(path) as fh:
            doc = json.load(fh)
        print(f"# {path}: {doc.get('weights', '')} {doc.get('date', '')} {doc.get('commit', '')}")
        print(table(doc, a.buckets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
