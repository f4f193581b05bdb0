"""What token accuracy would a draft need for the issue's goal 2 ("within 3 points of the oracle")? Read from
``quality selection`` result files (2026-12-07 on: per-position figures).

    python experiments/long_context_draft/accuracy_needed.py RESULT.json [RESULT.json ...] [--gap 3]

Per context and K, each draft's decode positions are split by whether its token was the one the target then
produced: its mean agreement with the next step's true top-K where right (A_right) and where wrong (A_wrong), per
text and position (the reported layers' mean), pooled over the texts. With the oracle's mean O, a draft right a
fraction a of the time agrees ~ a * A_right + (1 - a) * A_wrong, so ``gap`` points under the oracle needs
a >= (O - gap - A_wrong) / (A_right - A_wrong). The table puts that next to the draft's measured accuracy, over all
positions and over the first 32 (before the continuation has a span to copy).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

SKIP = ("oracle", "random")


def pooled(doc: dict) -> dict:
    """(n_tokens, K) -> {"proxy": [...], draft: (right bool [n], agreement [n])} over every text's positions."""
    out = defaultdict(lambda: defaultdict(lambda: ([], [])))
    for r in doc["results"]:
        key = (r["n_tokens"], r["k"])
        out[key]["proxy"][1].extend(r["proxy_per_position"])
        for name, d in r["drafts"].items():
            right, agree = out[key][name]
            right.extend(d["right_per_position"])
            agree.extend(d["sparse_per_position"])
    return out


def needed(o: float, a_right: float, a_wrong: float, gap: float) -> float:
    """The accuracy at which a draft agreeing a_right where right and a_wrong where wrong sits ``gap`` under o."""
    return (o - gap - a_wrong) / (a_right - a_wrong)


def rows(doc: dict, gap: float, first: int = 32) -> list[str]:
    lines, p = [], positions(doc)
    for (n, k), by in sorted(pooled(doc).items()):
        o = 100 * np.mean(by["oracle"][1])
        px = 100 * np.mean(by["proxy"][1])
        for name, (right, agree) in by.items():
            if name in SKIP or name == "proxy":
                continue
            r, a = np.asarray(right, bool), 100 * np.asarray(agree)
            early = np.arange(len(r)) % p < first  # each text's positions in order, text after text
            a_r, a_w = a[r].mean(), a[~r].mean()
            lines.append(
                f"| {n} | {k} | {name} | {o:.1f} | {px:.1f} | {a_r:.1f} | {a_w:.1f} | {a.mean():.1f} | "
                f"{100 * r.mean():.0f} / {100 * r[early].mean():.0f} | **{100 * needed(o, a_r, a_w, gap):.0f}** |"
            )
    return lines


def positions(doc: dict) -> int:
    """Decode positions a text: every result of a file measures the same number."""
    p = {len(r["proxy_per_position"]) for r in doc["results"]}
    if len(p) != 1:
        raise SystemExit(f"results measure {sorted(p)} positions: expected one count")
    return p.pop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--gap", type=float, default=3.0, help="points under the oracle the goal allows")
    args = ap.parse_args()
    for path in args.results:
        doc = json.load(open(path))
        print(f"\n{path} ({doc.get('generation', '?')}; {len(doc['results'])} text x K results)")
        print(
            "| tokens | K | draft | oracle | proxy | A_right | A_wrong | agreement | accuracy (all / first 32) | "
            f"accuracy needed for {args.gap:g} under the oracle |"
        )
        print("| --- " * 10 + "|")
        print("\n".join(rows(doc, args.gap)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
