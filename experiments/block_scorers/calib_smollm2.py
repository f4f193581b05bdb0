"""The calibration dump of SmolLM2-135M for ``fit_basis.py`` (the per-token scorer's channels, ``--block-score
tokens``): every layer's keys at every position and every 8th query (RoPE applied, the executor's decoder, fp32, CPU)
of a training window of ``../long_context_draft/data/smollm2_8k.npz`` (``train:I``: CPython standard library and
``/usr/share/doc`` files with the evaluation texts out; never an evaluation text). Then the bases, as Gemma's:

    python experiments/block_scorers/calib_smollm2.py --text train:0 --n-tokens 4096 --out /tmp/smollm2_calib.pt
    python experiments/block_scorers/fit_basis.py /tmp/smollm2_calib.pt --ranks 16 24 32 --pairs-only \
        --out experiments/block_scorers/calib/smollm2_135m_basis.npz

SmolLM2's head dim is 64: rank 16 = D / 4 (the engine's default ``token_rank``, twice the min/max bytes), 24 (3×), 32 = D / 2 (4×).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oasis_exec.model.decoder import Decoder  # noqa: E402
from oasis_exec.model.gguf import smollm2_path  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "long_context_draft", "data", "smollm2_8k.npz")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default="train:0", help="train:I, a training window of smollm2_8k.npz")
    ap.add_argument("--n-tokens", type=int, default=4096)
    ap.add_argument("--q-every", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    split, idx = args.text.split(":")
    if split != "train":
        raise SystemExit("--text: a training window only (train:I); the held-out windows are evaluation texts")
    ids = np.load(DATA)["train"][int(idx), : args.n_tokens].astype(np.int64)
    dec = Decoder.from_path(smollm2_path(), dtype=torch.float32, device="cpu")
    ks, qs = {}, {}

    def hook(layer, q, k, v, x):
        ks[layer] = k.detach().clone()  # [T, Hkv, D]
        qs[layer] = q[:: args.q_every].detach().clone()  # [T / 8, Hq, D]

    with torch.no_grad():
        dec.forward_dense(torch.as_tensor(ids), hook)
    layers = sorted(ks)
    torch.save(
        {"text": args.text, "data": "experiments/long_context_draft/data/smollm2_8k.npz", "model": "SmolLM2-135M",
         "n": len(ids), "layers": layers, "k": ks, "q": qs, "command": "python " + " ".join(sys.argv)},
        args.out,
    )  # fmt: skip
    print(f"wrote {args.out}: {len(layers)} layers, {len(ids)} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
