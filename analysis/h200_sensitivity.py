"""Issue 5 item 4's drift / fetch-ratio sensitivity of 2026-11-30 (run 6): now a preset of ``h200_headline.py``.

    python analysis/h200_sensitivity.py --out FILE.jsonl [--budget-s 90] [--steps 16] [--warmup 4] [--n 32,16] \\
        [--dense-n 21] [--context 16384] [--dry-run]
    == python analysis/h200_headline.py --preset sensitivity-2026-11-30 --out FILE.jsonl [--la-n 32,16] ...

The plan, its labels and its records are those of run 6 (``exec_h200_sensitivity_2026-11-30.jsonl``): lookahead at
each ``--n`` with the variants base, drift2, drift4 (drift_zone raised to 0.48), fr0.02, fr0.1, and dense at
``--dense-n`` after the first concurrency. Kept so that ``analysis/h200_graph.sh`` runs as it did; the options map
onto ``h200_headline.py``'s (``--n`` -> ``--la-n``; ``--dense-n 0`` = no dense run); the new sweep runs the same
variants across concurrency (``h200_headline.py --sens-n``).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h200_headline  # noqa: E402


def translate(argv) -> list:
    out = ["--preset", "sensitivity-2026-11-30"]
    for x in argv:
        if x == "--n":
            x = "--la-n"
        elif x.startswith("--n="):
            x = "--la-n=" + x[4:]
        out.append(x)
    return out


def main(argv=None) -> int:
    return h200_headline.main(translate(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
