"""Fit the per-token scorer's bases (``oasis_core.token_scorer``) per full layer and KV head from a calibration
dump (keys of every position, every 8th query of a training window, never an evaluation text): Gemma's of
``gemma_chunked.py --calib`` (``../long_context_draft/data/gemma_32k.npz``), SmolLM2's of ``calib_smollm2.py``
(``smollm2_8k.npz``):

- ``pairs{r}``: the r / 2 RoPE channel pairs (``i``, ``i + D / 2``) of largest ``E[q_i^2] E[k_i^2]`` summed over
  the pair (Double Sparsity's label channels, kept pairwise: a pair's energy is the same at every position);
- ``qpca{r}``: the top-r eigenvectors of the query second moment (the subspace the queries live in; position
  dependent under RoPE, kept for comparison).

    python experiments/block_scorers/gemma_chunked.py --text train:0 --n-tokens 8192 --calib /tmp/calib.pt
    python experiments/block_scorers/fit_basis.py /tmp/calib.pt --ranks 32 64 \
        --out experiments/block_scorers/calib/gemma3_270m_basis.npz

The ``.npz`` holds ``L{layer}_{name}`` ([Hkv, r] channel ids for pairs, [Hkv, D, r] float32 for qpca) and ``meta``
(JSON: the command, the calibration text, its length).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oasis_core.token_scorer import channel_basis  # noqa: E402


def fit(k, q, ranks):
    """k: [T, Hkv, D]; q: [S, Hq, D] -> {name: array}."""
    _, hkv, d = k.shape
    g = q.shape[1] // hkv
    h2 = d // 2
    out = {}
    for r in ranks:
        chans, pcas = [], []
        for h in range(hkv):
            kh = k[:, h].double()
            qh = q[:, h * g : (h + 1) * g].reshape(-1, d).double()
            eq, ek = (qh * qh).mean(0), (kh * kh).mean(0)
            w = eq[:h2] * ek[:h2] + eq[h2:] * ek[h2:]
            top = torch.sort(torch.argsort(w, descending=True)[: r // 2]).values
            chans.append(torch.cat([top, top + h2]).numpy())
            _, vecs = torch.linalg.eigh(qh.T @ qh / qh.shape[0])
            pcas.append(vecs[:, -r:].float().numpy())
        out[f"pairs{r}"] = np.stack(chans).astype(np.int32)
        out[f"qpca{r}"] = np.stack(pcas)
    return out


def load(path: str, layer: int, name: str, head_dim: int):
    """The basis [Hkv, D, r] (float32 numpy) of ``name`` for ``layer`` from a ``fit_basis`` npz."""
    arr = np.load(path)[f"L{layer}_{name}"]
    return channel_basis(arr, head_dim, np.float32) if name.startswith("pairs") else arr.astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("calib")
    ap.add_argument("--ranks", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pairs-only", action="store_true", help="only the channel pairs (what the engine reads)")
    args = ap.parse_args()
    dump = torch.load(args.calib)
    arrays = {}
    for li in dump["layers"]:
        for name, arr in fit(dump["k"][li].float(), dump["q"][li].float(), args.ranks).items():
            if args.pairs_only and not name.startswith("pairs"):
                continue
            arrays[f"L{li}_{name}"] = arr
    model = dump.get("model", "Gemma 3 270M")  # gemma_chunked.py's dumps name neither model nor data
    data = dump.get("data", "experiments/long_context_draft/data/gemma_32k.npz")
    meta = {
        "what": f"per-token scorer bases of {model}'s full layers (oasis_core.token_scorer)",
        "calibration_text": f"{dump['text']} of {data} (a training window)",
        "calibration_tokens": dump["n"],
        "layers": dump["layers"],
        "command": "python " + " ".join(sys.argv),
        **({"dump_command": dump["command"]} if "command" in dump else {}),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez_compressed(args.out, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {args.out}: {sorted(arrays)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
