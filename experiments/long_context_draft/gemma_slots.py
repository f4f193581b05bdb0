"""Synthetic selections true to real ones on Gemma 3 270M (issue 37): fetches a row a step at S = K, 2K, 3K slots on
real attention against the generator, and the ``gemma3`` preset's fit.

Real: a dump of Gemma's three full layers (5, 11, 17) near the end of a long text -- every key (post-RoPE) and the
queries at P consecutive positions t and t + 1 -- as ``experiments/block_scorers/gemma_chunked.py --dump`` writes it
(the first format ``{"n", "ts", "k": {layer: [N, 1, 256]}, "q_cur"/"q_next": {layer: [P, 4, 256]}}``, or the later
one with every layer's cache ``kc`` and the full layers' queries ``qk`` at t0 .. t0 + P: ``load_dump``; a few
minutes of CPU at 16K, 20 or more at 32K). The true sets are the harness's (``quality selection``, ``_topk``: min/max
summaries, block 16, the local block excluded): ``T_t`` of ``q_t``, ``T_{t+1}`` of ``q_{t+1}``. ``--save-sets NPZ``
keeps them (int16, a few hundred KB) so the comparison runs again from the npz without the dump (``--n``,
``--positions``). The prediction replayed is the **correct draft in the dense view** (``T_{t+1}`` itself: what a
right draft token gives, up to the sparse view's 1-2 points) and the proxy (``q_t`` over the blocks of t + 1),
through ``replay_policy`` (policy ``unlimited``: every missing predicted block fetched), resident set from
``T_{t0}``; fetches a row a step over the second half of the steps (``fetch_late``, as ``synthetic_vs_real.py``).
Savings at S = R K: ``1 - fetch(S) / fetch(K)``.

Statistics (the harness's definitions: adjacent overlap, proxy recall, new blocks per step and late, entering rank;
agreement 1 for the correct draft in the dense view; one KV head, so no head overlap) -> ``synthetic_fit.fit_params``
-> the fitted parameters (``fit@K=...`` rows; ``--fit-k`` is printed), and the generator under them and each named
preset (``--preset``) at the same geometry (3 rows, N / 16 blocks, K, P steps; ``--seeds`` generator seeds averaged).
The ``gemma3`` preset itself is fitted by ``fit_returns.py`` (that statistics fit has no returns).

    python experiments/long_context_draft/gemma_slots.py /tmp/s32k/lic32k.pt --preset gemma3 smollm2 paper \
        --save-sets experiments/long_context_draft/data/gemma_topk_sets.npz
    python experiments/long_context_draft/gemma_slots.py experiments/long_context_draft/data/gemma_topk_sets.npz \
        --n 32768 --positions 16 --preset gemma3 smollm2 paper \
        --out experiments/long_context_draft/results/gemma_slots_32k_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]

from synthetic_vs_real import savings, synthetic_fetch  # noqa: E402

from oasis_core import provenance  # noqa: E402
from oasis_core.fetchcap import get_policy  # noqa: E402
from oasis_core.scoring import build_summaries  # noqa: E402
from oasis_core.synthetic_fit import MeasuredSelection, fit_params  # noqa: E402
from oasis_core.synthetic_presets import resolve  # noqa: E402
from oasis_exec.tools.quality import metrics  # noqa: E402
from oasis_exec.tools.quality.selection import PolicyLink, _topk, replay_policy  # noqa: E402

BS = 16
EXP = "experiments/long_context_draft"  # this folder, from the repository root (the provenance's dirty check)
RATIOS = (1.0, 2.0, 3.0)


def load_dump(path: str) -> dict:
    """A ``gemma_chunked.py --dump`` in either format as ``{"text", "n", "ts", "k", "q_cur", "q_next"}`` (full
    layers only): the first dumps hold those keys, later ones every layer's cache (``kc``) and the full layers'
    queries at t0 .. t0 + P (``qk``)."""
    dump = torch.load(path, map_location="cpu")
    if "k" in dump:
        return dump
    full = sorted(dump["qk"])
    return {"text": dump["text"], "n": dump["n"], "ts": dump["ts"], "k": {i: dump["kc"][i] for i in full},
            "q_cur": {i: dump["qk"][i][:-1] for i in full}, "q_next": {i: dump["qk"][i][1:] for i in full}}  # fmt: skip


def true_sets(dump: dict, k: int) -> dict:
    """{"seq": T_{t0}, T_{t0+1}, ... int64 [L, P + 1, k], "proxy": [L, P, k]} as the harness defines them: ``T_t`` of
    ``q_t``, the proxy ``q_t`` over the blocks of t + 1; layers in order (one KV head each)."""
    ts = dump["ts"].long()
    nb_t, nb_t1 = ts // BS + 1, (ts + 1) // BS + 1
    seq, prox = [], []
    for li in sorted(dump["k"]):
        kmin, kmax = build_summaries(dump["k"][li].float().transpose(0, 1), BS)  # [Hkv, NB, D]
        tc = _topk(dump["q_cur"][li], kmin, kmax, k, nb_t)[:, 0]
        tn = _topk(dump["q_next"][li], kmin, kmax, k, nb_t1)[:, 0]
        seq.append(torch.cat([tc[:1], tn]))  # teacher forced: q_{t+1} is the next step's q_t
        prox.append(_topk(dump["q_cur"][li], kmin, kmax, k, nb_t1)[:, 0])
    return {"seq": torch.stack(seq).numpy(), "proxy": torch.stack(prox).numpy()}


def save_sets(path: str, by_run: dict) -> None:
    """{(n, P): (positions, {k: true_sets})} -> one npz: ``n{n}p{P}_ts``, ``n{n}p{P}_k{k}_seq`` / ``_proxy``
    (int16), one run per context length and number of positions."""
    arrays = {}
    for (n, p_), (ts, by_k) in by_run.items():
        tag = f"n{n}p{p_}"
        arrays[f"{tag}_ts"] = np.asarray(ts, np.int64)
        for k, s in by_k.items():
            arrays[f"{tag}_k{k}_seq"], arrays[f"{tag}_k{k}_proxy"] = (
                s["seq"].astype(np.int16),
                s["proxy"].astype(np.int16),
            )
    np.savez_compressed(path, **arrays)


def runs(path: str) -> list:
    """The (n, P) runs of a ``save_sets`` npz."""
    tags = {f.split("_")[0] for f in np.load(path).files}
    return sorted((int(t[1:].split("p")[0]), int(t.split("p")[1])) for t in tags)


def load_sets(path: str, n: int, positions: int | None = None) -> tuple:
    """(positions, {k: {"seq", "proxy"} int64}) of the run of context ``n`` (and ``positions`` steps, needed only
    when the npz holds several runs of that length) from a ``save_sets`` npz."""
    cands = [p_ for m, p_ in runs(path) if m == n and positions in (None, p_)]
    if len(cands) != 1:
        raise ValueError(f"{path}: runs of n = {n}: {cands} (pass the number of positions)")
    z, tag = np.load(path), f"n{n}p{cands[0]}"
    ks = sorted(int(key.split("_")[1][1:]) for key in z.files if key.startswith(f"{tag}_k") and key.endswith("_seq"))
    by_k = {k: {w: z[f"{tag}_k{k}_{w}"].astype(np.int64) for w in ("seq", "proxy")} for k in ks}
    return z[f"{tag}_ts"], by_k


def measured(sets: dict, k: int, n_blocks: int) -> tuple[MeasuredSelection, dict]:
    seq_all, prox_all = torch.from_numpy(sets["seq"]), torch.from_numpy(sets["proxy"])
    adj, prox, new, new_late, rs_sum, rs_cnt = [], [], [], [], 0.0, 0
    for seq, px in zip(seq_all[:, :, None], prox_all[:, :, None]):  # per layer: [P + 1, 1, k], [P, 1, k]
        adj.append(metrics.set_overlap(seq[:-1], seq[1:]).mean().item())
        prox.append(metrics.set_overlap(px, seq[1:]).mean().item())
        hist = torch.zeros(1, n_blocks + 1, dtype=torch.bool)
        metrics.new_blocks(hist, seq[0])
        fresh = [metrics.new_blocks(hist, seq[i]).float().mean().item() for i in range(1, len(seq))]
        new.append(float(np.mean(fresh)))
        new_late.append(float(np.mean(fresh[len(fresh) // 2 :])))
        s, c = metrics.entering_ranks(seq[:-1].reshape(-1, k), seq[1:].reshape(-1, k))
        rs_sum, rs_cnt = rs_sum + s.sum().item(), rs_cnt + int(c.sum().item())
    stats = dict(agreement=1.0, min_layer_agreement=1.0, proxy_recall=float(np.mean(prox)),
                 adjacent_overlap=float(np.mean(adj)), head_overlap=1.0, new_per_step=float(np.mean(new)),
                 new_late=float(np.mean(new_late)), entering_rank=rs_sum / max(rs_cnt, 1))  # fmt: skip
    m = MeasuredSelection(**stats, k=k, n_blocks=n_blocks, layers=seq_all.shape[0], kv_heads=1,
                          steps=seq_all.shape[1] - 1)  # fmt: skip
    return m, stats


def real_fetch(sets: dict, which: str = "seq") -> dict:
    """{ratio: blocks fetched a row a step, second half} replaying the correct draft (``seq``: T_{t+1}) or the proxy
    (``proxy``) from ``T_{t0}``; rows layer-major (L layers x 1 KV head)."""
    seq = sets["seq"]
    initial = seq[:, 0]  # [R, k]
    preds = np.swapaxes(seq[:, 1:] if which == "seq" else sets[which], 0, 1)  # [P, R, k]
    k = seq.shape[-1]
    out = {}
    for r in RATIOS:
        _, fetch, _ = replay_policy(get_policy("unlimited"), initial, preds, seq.shape[0], PolicyLink(), int(r * k))
        f = np.asarray(fetch, np.float64)
        out[r] = float(f[len(f) // 2 :].mean())
    return out


def synthetic_mean(params, n_blocks: int, k: int, steps: int, seeds: int, layers: int = 3) -> dict:
    """{ratio: fetches a row a step} of the generator at Gemma's geometry, averaged over ``seeds`` seeds."""
    syn = {r: 0.0 for r in RATIOS}
    for seed in range(seeds):
        for r, v in synthetic_fetch(params, layers, layers, 1, n_blocks, k, steps, RATIOS, seed).items():
            syn[r] += v / seeds
    return syn


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a gemma_chunked.py --dump (.pt) or a save_sets npz (with --n)")
    ap.add_argument("--n", type=int, default=None, help="the context length to read from a sets npz")
    ap.add_argument("--positions", type=int, default=None, help="its number of positions (several runs of one n)")
    ap.add_argument("--text", default="licences", help="the text a sets npz was made from (a label for the JSON)")
    ap.add_argument("--ks", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--preset", nargs="+", default=["paper", "smollm2"])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--fit-k", type=int, default=None, help="the K whose statistics the printed preset is fitted at")
    ap.add_argument("--save-sets", default=None, help="with a dump: add its top-K sets to this npz (save_sets)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.source.endswith(".npz"):
        ts, by_k = load_sets(a.source, a.n, a.positions)
        n, text = a.n, a.text
    else:
        dump = load_dump(a.source)
        n, ts, text = int(dump["n"]), dump["ts"].numpy(), dump.get("text")
        by_k = {k: true_sets(dump, k) for k in a.ks}
        if a.save_sets:
            have = {r: load_sets(a.save_sets, *r) for r in runs(a.save_sets)} if os.path.exists(a.save_sets) else {}
            have[(n, len(ts))] = (ts, by_k)
            save_sets(a.save_sets, have)
    steps, nb = len(ts), -(-n // BS)
    rows, fits = [], {}
    for k in a.ks:
        sets = by_k[k]
        m, stats = measured(sets, k, nb)
        fitted, achieved = fit_params(m, base=resolve({"preset": "smollm2"}))
        fits[k] = {"params": dataclasses.asdict(fitted), "measured": stats,
                   "achieved": {s: getattr(achieved, s) for s in stats}}  # fmt: skip
        real = {"lookahead": real_fetch(sets), "proxy": real_fetch(sets, "proxy")}
        rs = savings(real["lookahead"])
        cands = [(f"fit@K={k}", fitted)] + [(p, resolve({"preset": p})) for p in a.preset]
        for name, params in cands:
            syn = synthetic_mean(params, nb, k, steps, a.seeds, sets["seq"].shape[0])
            ss = savings(syn)
            ok = all(abs(ss[r] - rs[r]) <= a.tolerance * abs(rs[r]) for r in rs)
            rows.append({"k": k, "preset": name, "real_fetch": real, "synthetic_fetch": syn, "real_savings": rs,
                         "synthetic_savings": ss, "within_tolerance": ok})  # fmt: skip
            cells = "  ".join(f"S={r:g}K real {100 * rs[r]:5.1f}% syn {100 * ss[r]:5.1f}%" for r in sorted(rs))
            print(f"K={k:<4} {name:>10}: fetch at S=K real {real['lookahead'][1.0]:.2f} (proxy "
                  f"{real['proxy'][1.0]:.2f}) syn {syn[1.0]:.2f} | {cells} | {'ok' if ok else 'MISS'}")  # fmt: skip
        print(f"K={k:<4} stats {json.dumps({s: round(v, 4) for s, v in stats.items()})}")
    fit_k = a.fit_k if a.fit_k is not None else a.ks[-1]
    print("fitted at K =", fit_k, json.dumps({p: round(v, 4) for p, v in fits[fit_k]["params"].items()}))
    if a.out:
        doc = {"what": "Gemma 3 270M full layers 5/11/17: fetches a row a step at S = K, 2K, 3K, real (correct draft "
               "in the dense view; proxy) vs the synthetic generator", "source": os.path.basename(a.source),
               "text": text, "n_tokens": n, "positions": [int(x) for x in ts],
               "block_size": BS, "weights": "real (gemma-3-270m-q4_k_m.gguf, fp32 on the CPU)",
               "selection_source": "real attention (min/max summaries); generator for the synthetic rows",
               "draft": "correct token, dense view (T_{t+1})", "seeds": a.seeds, "tolerance": a.tolerance,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "commit": provenance.commit(dirty_paths=["oasis_core", "oasis_exec", f"{EXP}/gemma_slots.py",
                                                        f"{EXP}/synthetic_vs_real.py"]),
               "device": f"cpu ({cpu_name()}, {os.cpu_count()} cores)",
               "fits": {str(k): v for k, v in fits.items()}, "rows": rows}  # fmt: skip
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0 if all(r["within_tolerance"] for r in rows if not r["preset"].startswith("fit")) else 1


if __name__ == "__main__":
    sys.exit(main())
