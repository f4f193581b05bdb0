"""Traffic per decode step that each synthetic preset (or a fit from a quality-selection JSON) implies.

Paper Algorithm 2 on the generator's draft predictions (``oasis_core.synthetic_fit.traffic``) at the Qwen3-8B shape
(36 layers, 8 KV heads, head dim 128, bf16: 8 KiB of K+V per (block, head, layer)), 16K tokens (1,024 blocks),
K = 128, fetch ratio 0.05 vs unlimited; GB per step for the paper's assumed batch of 128 requests.

    python experiments/draft_predicts_next_blocks/traffic.py [--from experiments/draft_predicts_next_blocks/results/selection_X.json --key 4096@0.125]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oasis_core.synthetic import SyntheticParams  # noqa: E402
from oasis_core.synthetic_fit import traffic  # noqa: E402
from oasis_core.synthetic_presets import PRESETS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="src", default=None, help="a quality selection JSON with fits")
    ap.add_argument("--key", default=None, help="its average to take the fits of (default: every one)")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--top-k", type=int, default=128)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args(argv)
    sets = dict(PRESETS)
    if a.src:
        with open(a.src) as fh:
            doc = json.load(fh)
        for key, avg in doc["average"].items():
            if a.key in (None, key):
                for d, f in avg.get("fit", {}).items():
                    sets[f"fit {key} {d}"] = SyntheticParams(**f["params"])
    print(
        f"| parameters | fetch ratio | fetched blocks / row / step | missing / row / step | recall of true top-K "
        f"| MB / request / step | GB / step at batch {a.batch} |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, p in sets.items():
        for ratio in (0.05, None):
            t = traffic(p, context_tokens=a.context, top_k=a.top_k, fetch_ratio=ratio, batch=a.batch)
            print(
                f"| {name} | {'unlimited' if ratio is None else ratio} | {t.fetch_blocks_per_row:.1f} | "
                f"{t.missing_blocks_per_row:.1f} | {100 * t.recall:.1f}% | {t.bytes_per_request / 1e6:.1f} | "
                f"{t.gb_per_step_batch:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
