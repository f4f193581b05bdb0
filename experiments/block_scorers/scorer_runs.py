"""What ``gemma_hf.py`` and ``gemma_chunked.py`` share once the keys and queries are recorded: each (scorer, K)'s
statistics and resident sets per full layer, the draft rows' resident sets, the correct draft's lookahead agreement,
the result rows (printed as they are made) and the JSON written. Definitions: ``oasis_exec.tools.quality.scorer_stats``.
"""

from __future__ import annotations

import json
import os

import torch

from oasis_exec.tools.quality.scorer_stats import SCORER_STATS


def layer_stats(ls, li, scorers, ks, q_cur, q_next, mass, ts, res, sets) -> None:
    """Full layer ``li``'s statistics (``ls``: its ``LayerScorers``) appended to ``res[(s, k)][stat]`` (a list, one
    entry a layer) and its resident sets ``(T^s_t, T^s_{t+1})`` [P, Hkv, K] stored in ``sets[(li, s, k)]``."""
    for s in scorers:
        for k in ks:
            st, tc, tn = ls.stats(s, k, q_cur, q_next, mass, ts)
            res.setdefault((s, k), {x: [] for x in (*SCORER_STATS, "lookahead")})
            for x in SCORER_STATS:
                res[(s, k)][x].append(st[x])
            sets[(li, s, k)] = (tc, tn)


def draft_sets(chunk, sets, li, max_k: int):
    """[R, Hkv, max_k] block ids: each draft row ``((s, k), j)`` of ``chunk`` gets ``T^s_t`` of position j, -1 past
    its K."""
    first = sets[(li, *chunk[0][0])][0]
    rs = torch.full((len(chunk), first.shape[1], max_k), -1, dtype=first.dtype, device=first.device)
    for r, ((s, k), j) in enumerate(chunk):
        rs[r, :, :k] = sets[(li, s, k)][0][j]
    return rs


def add_lookahead(layers, full, q_draft, variants, p_: int, sets, res, ts) -> None:
    """The correct draft's agreement per full layer appended to ``res[(s, k)]["lookahead"]``; ``q_draft[li]``: the
    layer's draft queries in chunks, rows ordered variant-major (``p_`` positions a variant)."""
    for li in full:
        qd = torch.cat(q_draft[li])
        for vi, (s, k) in enumerate(variants):
            a = layers[li].agreement(s, k, qd[vi * p_ : (vi + 1) * p_], sets[(li, s, k)][1], ts)
            res[(s, k)]["lookahead"].append(a)


def result_rows(res, n: int, bs: int, bytes_of, width: int) -> list:
    """One row a (scorer, K): the layers' mean of each statistic measured, the per-layer lists, ``bytes_of(scorer)``;
    each printed as it is made (scorer names padded to ``width``)."""
    table = []
    for (s, k), v in res.items():
        row = {"scorer": s, "k": k, "k_frac": k / -(-n // bs)}
        row.update({x: sum(vals) / len(vals) for x, vals in v.items() if vals})
        row["per_layer"] = v
        row["bytes"] = bytes_of(s)
        table.append(row)
        la = f"{100 * row['lookahead']:5.1f}" if "lookahead" in row else "  -  "
        print(
            f"{s:<{width}} K={k:<4} mass {100 * row['mass']:5.1f} best {100 * row['best']:5.1f} recall "
            f"{100 * row['recall']:5.1f} proxy {100 * row['proxy']:5.1f} lookahead {la}",
            flush=True,
        )
    return table


def device_name(dev: torch.device) -> str:
    return str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")


def write_json(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {path} ({doc['elapsed_s']} s)")
