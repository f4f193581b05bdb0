"""The headline sweep and the transfer-path comparison on the H200 in one process, so the pinned host pool is pinned once for all of them.

    python experiments/dense_vs_lookahead_throughput/h200_sweep_with_transfer_paths.py --out-dir DIR [--budget-s 420] [--torch-select] [--dry-run]

1. ``h200_headline.py --preset headline`` (dense vs lookahead at 52 GB, 16K and 32K, to each mode's maximum; the
   no-transfer twins; the whole-H200 dense anchors; fused vs plain twins; the sensitivity variants at a few 16K
   points) -> DIR/headline.jsonl;
2. ``transfer_paths.py`` (UVA gather on 8/16/32 programs against the host-threaded gather + DMA, at
   64, 32 and 8 requests) -> DIR/transfer_paths.jsonl, on what is left of the budget.

The headline pins its largest pool first (``oasis_exec.kv.store.pinned_pieces`` keeps it); the transfer runs reuse
it. ``--torch-select``: plan the selection with the torch ``oasis_core.selection.plan_step`` instead of the fused
``oasis_kernels.plan_select`` (the fallback if that kernel's GPU test fails); ``--plain-kv-write`` likewise for
``oasis_kernels.kv_write``. Each part resumes by label when re-run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--budget-s", type=float, default=420.0, help="both parts together (s)")
    ap.add_argument("--headline-share", type=float, default=0.6, help="share of the budget the headline may use")
    ap.add_argument("--torch-select", action="store_true")
    ap.add_argument(
        "--plain-kv-write",
        action="store_true",
        help="the K/V write by advanced indexing instead of "
        "oasis_kernels.kv_write (the fallback if that kernel's GPU test fails)",
    )
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--headline-args", default="", help="extra arguments for h200_headline.py (one string)")
    ap.add_argument("--transfer-args", default="", help="extra arguments for transfer_paths.py (one string)")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    if a.torch_select or a.plain_kv_write:
        # Both parts build their ExecConfig inside main(): give them one whose defaults are these fields.
        import dataclasses

        import oasis_exec.config as exec_config

        base = exec_config.ExecConfig
        exec_config.ExecConfig = dataclasses.make_dataclass(
            "ExecConfig",
            [
                ("fused_select", bool, dataclasses.field(default=not a.torch_select)),
                ("fused_kv_write", bool, dataclasses.field(default=not a.plain_kv_write)),
            ],
            bases=(base,),
            frozen=True,
        )
    from experiments.dense_vs_lookahead_throughput import h200_headline
    from experiments.transfer_paths import transfer_paths

    t0 = time.perf_counter()
    dry = ["--dry-run"] if a.dry_run else []
    rc1 = h200_headline.main(
        [
            "--preset",
            "headline",
            "--out",
            os.path.join(a.out_dir, "headline.jsonl"),
            "--budget-s",
            str(a.budget_s * a.headline_share),
            "--device",
            a.device,
        ]
        + a.headline_args.split()
        + dry
    )
    if rc1 == 3:  # the headline stopped on a sticky CUDA error: this process's GPU state is gone
        return rc1
    left = a.budget_s - (time.perf_counter() - t0)
    print(f"[h200_sweep_with_transfer_paths] headline rc={rc1}, {left:.0f} s left for the transfer paths", flush=True)
    rc2 = 0
    if left > 30 or a.dry_run:
        rc2 = transfer_paths.main(
            [
                "--out",
                os.path.join(a.out_dir, "transfer_paths.jsonl"),
                "--budget-s",
                str(max(left, 1.0)),
                "--device",
                a.device,
            ]
            + a.transfer_args.split()
            + dry
        )
    return rc1 or rc2


if __name__ == "__main__":
    sys.exit(main())
