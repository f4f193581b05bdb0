"""``quality endtoend`` without its dense engine and without greedy requests: the sparse variants' teacher-forced
perplexity alone, for a CPU where one 8K engine is a quarter of an hour.

The command always runs dense first (greedy agreement and the oracle draft need its tokens) and a greedy request per
text (a second 8K prefill). Neither changes a sparse variant's teacher-forced NLL, so this wrapper drops both and
compares against the dense perplexity of an earlier run of the same texts, lengths and ``--ppl-tokens``
(``results/e2e_retrieval_cpu_8192.json``: GPL-3 8.1695, argparse.py 1.5421 at 8K, 63 tokens scored). Same options
as ``python -m oasis_exec quality endtoend`` (``--greedy-tokens`` is ignored):

    nice -n 10 python experiments/block_scorers/e2e_sparse_only.py --device cpu --lengths 8192 --k-fracs 0.125 \
        --modes retrieval --block-scores minmax --texts GPL-3 --ppl-tokens 63 --passkey-lengths --threads 2 \
        --out experiments/block_scorers/results/e2e_retrieval_cpu_8192_gpl3_minmax.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oasis_core.modes import get as get_mode  # noqa: E402
from oasis_exec.tools.quality import endtoend as e2e  # noqa: E402

_variants, _build = e2e.variants, e2e.build_tasks


def variants(*a, **kw):
    """The selecting variants at a K (with every mode taken as a reference, ``_variants`` also lists each mode once
    bare, as it lists dense: no K, so one block; dropped)."""
    return [v for v in _variants(*a, **kw) if get_mode(v.mode).selects and (v.k_frac, v.top_k) != (None, None)]


def build_tasks(*a, **kw):
    return _build(*a, **{**kw, "greedy_tokens": 0})


if __name__ == "__main__":
    e2e.variants, e2e.build_tasks = variants, build_tasks
    e2e._is_reference = lambda mode: True  # each sparse engine stands alone (no dense to compare with here)
    sys.argv = ["python -m oasis_exec", "quality", "endtoend", *sys.argv[1:]]
    from oasis_exec.__main__ import main

    raise SystemExit(main(sys.argv[1:]))
