"""The host path's per-layer pipeline without the model: where does its in-step rate go? (issue 5 item 1)

    python experiments/transfer_paths/host_dma_pipeline.py --out FILE.json [--layers 36] [--items 3072] [--threads 16]
        [--pool-gb 32] [--reps 5] [--gemms 800]
    python experiments/transfer_paths/host_dma_pipeline.py --summarize FILE.json [FILE.json ...] --md OUT.md

Inside the decode step at 64 requests the host path's native CPU gather moved ~26 GB/s and its DMAs ~26 GB/s
(``results/native_host_gather_in_step.md``), against 55.3 GB/s for one large pinned copy (125 GB/s for the gather
alone turned out to be the host's L3, not DRAM: see ``oasis_kernels/bench_host_gather.py``). This replays the worker's
loop on synthetic copy lists (``--items`` (block, head) rows of K and V per layer, random rows of a pool registered
like the engine's, ``oasis_exec.kv.store.pinned_pieces``),
with the engine's own pieces (``oasis_kernels.host_native.Gatherer``, pinned staging per layer, ``HostStager.upload``),
in five modes:

- ``gather``: the CPU gathers only; ``dma``: the DMAs only (staging already filled);
- ``pipeline``: per layer, wait for the layer's staging to be free, gather, enqueue its DMA (the worker's loop);
- ``pipeline+load``: the same while HBM-bound GEMMs run on the main stream (a stand-in for the step's kernels);
- ``dma+load``: the DMAs beside the same load.

Per mode: wall ms for all layers, GB/s (K + V bytes / wall), and for the pipeline modes the CPU gather's and the
DMAs' own ms (perf_counter around each gather call; CUDA events around each layer's DMAs). One JSON file;
``--summarize`` tabulates several (e.g. one per thread count) into markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

HKV, BS, D = 8, 16, 128


def summarize(files, md) -> None:
    from experiments.common.reporting import provenance

    runs = []
    for f in files:
        with open(f) as fh:
            runs.append(json.load(fh))
    runs.sort(key=lambda r: r["meta"]["threads"])
    m0 = runs[0]["meta"]
    prov = provenance()
    f1 = lambda x: "–" if x is None else f"{x:.1f}"  # noqa: E731
    lines = [
        "# The host path's worker loop without the model (issue 5 item 1)",
        "",
        f"Measured on **{m0['device']}** ({m0['date'][:10]}, the commit of each run in the table, torch "
        f"{m0['torch']}); "
        f"summarized at `{prov['commit']}`. Per repetition: {m0['layers']} layers x {m0['items']:,} (block, "
        f"head) rows of K and V ({m0['bytes'] / 1e6:.0f} MB: one step at 64 requests), random rows of a "
        f"{m0['pool_gb']:.0f} GB pool registered like the engine's; median of the repetitions. Load = "
        f"{m0['load_gemms']} bf16 GEMMs [64, 4096] x [4096, 16384] on the main stream "
        f"({m0['load_alone_ms']:.0f} ms alone, longer than every loop). Sources: "
        + ", ".join(f"`{os.path.basename(f)}`" for f in files)
        + ".",
        "",
        "| threads | mode | wall ms | GB/s (wall) | CPU gather GB/s | DMA GB/s |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    mislabelled = False
    for r in runs:
        for row in r["rows"]:
            mode = row["mode"]
            if mode == "dma+load" and row.get("gather_ms") is not None:  # before 0e771b7 its loop gathered too
                mode, mislabelled = "dma+load\\*", True
            lines.append(
                f"| {r['meta']['threads']} (`{r['meta']['commit']}`) | {mode} | {row['wall_ms']:.2f} | "
                f"{row['gb_s']:.1f} | {f1(row['gather_gb_s'])} | {f1(row['dma_gb_s'])} |"
                + ("" if row["correct"] else " (copy check FAILED)")
            )
    if mislabelled:
        lines += [
            "",
            "\\* Runs before 0e771b7 gathered inside the `dma+load` loop too (the DMA-only test re-gathered "
            "every layer): those rows are a second `pipeline+load`, not the DMA beside the load.",
        ]
    with open(md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {md}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--summarize", nargs="+", metavar="FILE.json")
    ap.add_argument("--md", help="--summarize: the markdown to write")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--items", type=int, default=3072, help="rows per layer: 3,072 = one layer at 64 requests")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--pool-gb", type=float, default=32.0, help="K + V pool, GB (registered once)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gemms", type=int, default=800, help="GEMMs of the load per repetition")
    a = ap.parse_args(argv)
    if a.summarize:
        summarize(a.summarize, a.md or "host_dma_pipeline.md")
        return 0
    if not a.out:
        ap.error("--out is required to measure")

    import torch

    from oasis_exec.kv.store import pinned_pieces
    from oasis_kernels.gather import HostStager
    from oasis_kernels.host_native import Gatherer

    dev = torch.device("cuda")
    row = BS * D * 2
    n_rows = int(a.pool_gb * 1e9 / 2 / row)
    t0 = time.perf_counter()
    pk, pv = [
        p.view(torch.bfloat16).view(n_rows // HKV, HKV, BS, D) for p in pinned_pieces(2, (n_rows // HKV) * HKV * row)
    ]
    pin_s = time.perf_counter() - t0
    L, n = a.layers, a.items
    stg = [HostStager(n, BS, D, device=dev, n_threads=None) for _ in range(L)]
    dst = torch.arange(n, dtype=torch.int32)
    outs = [torch.empty(n, dtype=torch.int32, pin_memory=True) for _ in range(L)]
    g = Gatherer(n, a.threads)
    s_copy = torch.cuda.Stream(dev)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(4096, 16384, device=dev, dtype=torch.bfloat16)
    x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    nbytes = L * n * row * 2

    def lists():
        return [torch.randint(0, (n_rows // HKV) * HKV, (n,), generator=gen, dtype=torch.int32) for _ in range(L)]

    def load():
        for _ in range(a.gemms):
            x @ w

    def run(mode):
        fl = lists()
        if mode.startswith("dma"):
            for l in range(L):
                g.gather_rows(pk, pv, fl[l], dst, n, stg[l].stage_k, stg[l].stage_v, outs[l])
        torch.cuda.synchronize()
        if mode.endswith("+load"):
            load()  # queued on the main stream: runs while the loop below goes
        ev = []
        gather_s = 0.0
        t = time.perf_counter()
        for l in range(L):
            if not mode.startswith("dma"):
                t1 = time.perf_counter()
                g.gather_rows(pk, pv, fl[l], dst, n, stg[l].stage_k, stg[l].stage_v, outs[l])
                gather_s += time.perf_counter() - t1
            if mode != "gather":
                with torch.cuda.stream(s_copy):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    stg[l].upload(n)
                    e1.record()
                    ev.append((e0, e1))
        s_copy.synchronize()
        wall = time.perf_counter() - t
        torch.cuda.synchronize()
        dma_ms = sum(e0.elapsed_time(e1) for e0, e1 in ev)
        want = pk.view(-1, BS, D)[int(fl[L - 1][n // 2])]  # the last layer's middle row, where it should have landed
        got = stg[L - 1].stage_k[n // 2] if mode == "gather" else stg[L - 1].gpu_k[n // 2].cpu()
        ok = torch.equal(got, want)
        return dict(
            wall_ms=1e3 * wall,
            gather_ms=1e3 * gather_s if not mode.startswith("dma") else None,
            dma_ms=dma_ms if ev else None,
            correct=bool(ok),
        )

    torch.cuda.synchronize()
    t = time.perf_counter()
    load()
    torch.cuda.synchronize()
    load_ms = 1e3 * (time.perf_counter() - t)
    rows = []
    for mode in ("gather", "dma", "pipeline", "dma+load", "pipeline+load"):
        run(mode)  # warm-up
        rs = [run(mode) for _ in range(a.reps)]
        rs.sort(key=lambda r: r["wall_ms"])
        r = dict(rs[len(rs) // 2], mode=mode)
        r["gb_s"] = nbytes / r["wall_ms"] / 1e6
        r["gather_gb_s"] = nbytes / r["gather_ms"] / 1e6 if r["gather_ms"] else None
        r["dma_gb_s"] = nbytes / r["dma_ms"] / 1e6 if r["dma_ms"] else None
        rows.append(r)
        print(
            f"{mode:14s} wall {r['wall_ms']:7.2f} ms {r['gb_s']:6.1f} GB/s  gather "
            f"{r['gather_gb_s'] or 0:6.1f} GB/s  dma {r['dma_gb_s'] or 0:6.1f} GB/s  ok={r['correct']}",
            flush=True,
        )
    meta = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=os.environ.get("OASIS_COMMIT", "?"),
        layers=L,
        items=n,
        threads=a.threads,
        bytes=nbytes,
        pool_gb=a.pool_gb,
        pin_s=round(pin_s, 1),
        load_gemms=a.gemms,
        load_alone_ms=load_ms,
        torch=torch.__version__,
    )
    with open(a.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
