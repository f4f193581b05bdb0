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

``--token-rank R`` (this wrapper's; the command has none): ``ExecConfig.token_rank`` of the ``tokens`` engines (0, the
default: head_dim / 4), recorded as ``settings.token_rank`` and the wrapper's own command line as ``wrapper_command``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oasis_core.modes import get as get_mode  # noqa: E402
from oasis_exec.tools.quality import endtoend as e2e  # noqa: E402

_variants, _build, _exec_config = e2e.variants, e2e.build_tasks, e2e.exec_config
TOKEN_RANK = 0


def variants(*a, **kw):
    """The selecting variants at a K (with every mode taken as a reference, ``_variants`` also lists each mode once
    bare, as it lists dense: no K, so one block; dropped)."""
    return [v for v in _variants(*a, **kw) if get_mode(v.mode).selects and (v.k_frac, v.top_k) != (None, None)]


def build_tasks(*a, **kw):
    return _build(*a, **{**kw, "greedy_tokens": 0})


def exec_config(*a, **kw):
    cfg = _exec_config(*a, **kw)
    return dataclasses.replace(cfg, token_rank=TOKEN_RANK) if cfg.block_score == "tokens" else cfg


def _pop(argv, flag):
    """The value of ``flag`` in ``argv`` (removed with it), else None."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


if __name__ == "__main__":
    wrapper_command = "python " + shlex.join(sys.argv)
    argv = sys.argv[1:]
    TOKEN_RANK = int(_pop(argv, "--token-rank") or 0)
    e2e.variants, e2e.build_tasks, e2e.exec_config = variants, build_tasks, exec_config
    e2e._is_reference = lambda mode: True  # each sparse engine stands alone (no dense to compare with here)
    sys.argv = ["python -m oasis_exec", "quality", "endtoend", *argv]
    from oasis_exec.__main__ import main

    rc = main(sys.argv[1:])
    out = _pop(argv, "--out")
    if rc == 0 and out:
        with open(out) as fh:
            doc = json.load(fh)
        doc["settings"]["token_rank"] = TOKEN_RANK
        doc["wrapper_command"] = wrapper_command
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
    raise SystemExit(rc)
