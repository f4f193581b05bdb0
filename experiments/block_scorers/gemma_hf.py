"""Block scorers on Gemma 3 270M's full layers (5, 11, 17), with transformers: mass, recall, proxy and the correct
draft's lookahead agreement per scorer and K (``oasis_exec.tools.quality.scorer_stats`` definitions).

The text: the Debian common licences (``/usr/share/common-licenses``, regular files, sorted by name, joined by blank
lines; the text the lead's Gemma measurements used), cut to N tokens (BOS first). One dense forward (transformers'
SDPA, fp32) records every layer's post-norm, post-RoPE keys and values and the full layers' queries at the P
positions ``t`` and ``t + 1`` near the end. Then the correct draft (the text's token ``x_{t+1}``) runs at position
``t + 1`` through the whole model, one row per (scorer, K, position), its full layers attending ``T^s_t`` + the local
block + itself (the engine's view), its sliding layers their 512-token window + itself; its full-layer queries are
scored by the same scorer against ``T^s_{t+1}``.

    python experiments/block_scorers/gemma_hf.py --n-tokens 16384 --positions 32 --threads 2 \
        --out experiments/block_scorers/results/gemma_16k_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from scorer_runs import add_lookahead, device_name, draft_sets, layer_stats, result_rows, write_json  # noqa: E402

from oasis_core.block_scorers import SCORERS, summary_bytes_per_token  # noqa: E402
from oasis_exec.tools.quality import metrics  # noqa: E402
from oasis_exec.tools.quality.draft_pass import resident_mask  # noqa: E402
from oasis_exec.tools.quality.scorer_stats import LayerScorers  # noqa: E402

GGUF = "/work/models/gemma-3-270m-q4_k_m.gguf"
LICENSES = "/usr/share/common-licenses"


def licence_text() -> str:
    names = sorted(f for f in os.listdir(LICENSES) if os.path.isfile(os.path.join(LICENSES, f)))
    names = [f for f in names if not os.path.islink(os.path.join(LICENSES, f))]
    return "\n\n".join(open(os.path.join(LICENSES, f), encoding="utf-8", errors="replace").read() for f in names)


class Recorder:
    """Wraps transformers' SDPA attention: in ``record`` mode it keeps K/V of every layer and Q of the full layers
    at ``ts`` and ``ts + 1``; in ``draft`` mode it attends each row's masked view of the recorded K/V + its own."""

    def __init__(self, sdpa, full_layers, ts):
        self.sdpa, self.full, self.ts = sdpa, set(full_layers), ts
        self.mode = "record"
        self.k, self.v, self.q_cur, self.q_next, self.q_draft = {}, {}, {}, {}, {}
        self.masks = None  # draft: per full layer bool [R, 1, T]; sliding window masks built here
        self.pos = None
        self.window = None

    def __call__(self, module, query, key, value, attention_mask, **kw):
        li = module.layer_idx
        if self.mode == "record":
            self.k[li], self.v[li] = key[0].transpose(0, 1).clone(), value[0].transpose(0, 1).clone()  # [T, Hkv, D]
            if li in self.full:
                q = query[0].transpose(0, 1)  # [T, Hq, D]
                self.q_cur[li], self.q_next[li] = q[self.ts].clone(), q[self.ts + 1].clone()
            return self.sdpa(module, query, key, value, attention_mask, **kw)
        # draft: query [R, Hq, 1, D], key/value [R, Hkv, 1, D] (the row's own)
        q, ks, vs = query[:, :, 0], key[:, :, 0], value[:, :, 0]
        k_ctx, v_ctx = self.k[li], self.v[li]
        t_ctx = k_ctx.shape[0]
        if li in self.full:
            self.q_draft[li] = q.clone()
            mask = self.masks[li]
        else:
            j = torch.arange(t_ctx, device=q.device)[None, :]
            mask = ((j < self.pos[:, None]) & (j > self.pos[:, None] - self.window))[:, None, :]
        r, hq, d = q.shape
        hk = ks.shape[1]
        qg = q.float().view(r, hk, hq // hk, d)
        sc = module.scaling
        s_ctx = torch.einsum("rhgd,thd->rhgt", qg, k_ctx.float()) * sc
        s_ctx = s_ctx.masked_fill(~mask[:, :, None, :], float("-inf"))
        s_self = torch.einsum("rhgd,rhd->rhg", qg, ks.float())[..., None] * sc
        p = torch.softmax(torch.cat([s_ctx, s_self], -1), -1)
        out = torch.einsum("rhgt,thd->rhgd", p[..., :-1], v_ctx.float()) + p[..., -1:] * vs.float()[:, :, None]
        return out.reshape(r, hq, 1, d).transpose(1, 2).to(query.dtype), None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-tokens", type=int, default=16384)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--ks", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--scorers", nargs="+", default=list(SCORERS), choices=SCORERS)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", default=GGUF)
    ap.add_argument("--draft-chunk", type=int, default=96, help="draft rows per forward (memory)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument(
        "--ids",
        default=None,
        help="token ids (JSON list) instead of tokenizing here: transformers 5.17 "
        "(the GPU machine's) converts this GGUF's tokenizer wrongly; make them with --save-ids on 5.25",
    )
    ap.add_argument("--save-ids", default=None, help="write the text's token ids (JSON) and exit")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    t0 = time.time()
    d, f = os.path.dirname(args.model), os.path.basename(args.model)
    if args.ids:
        with open(args.ids) as fh:
            ids = json.load(fh)["ids"]
    else:
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        ids = tok(licence_text(), add_special_tokens=True)["input_ids"]
    if args.save_ids:
        with open(args.save_ids, "w") as fh:
            json.dump(
                {
                    "what": "Gemma 3 270M token ids (transformers 5.25, BOS first) of " + LICENSES + " sorted, joined",
                    "ids": ids,
                },
                fh,
            )
        return 0
    dev = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="sdpa")
    model.eval().to(dev)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    ids = ids[: args.n_tokens]
    n, bs, p_ = len(ids), args.block_size, args.positions
    ts = torch.arange(n - 1 - p_, n - 1, device=dev)
    rec = Recorder(ALL_ATTENTION_FUNCTIONS["sdpa"], full, ts)
    rec.window = cfg.sliding_window
    ALL_ATTENTION_FUNCTIONS["sdpa"] = rec
    with torch.no_grad():
        model(input_ids=torch.tensor([ids], device=dev), use_cache=False, logits_to_keep=1)
    t_fwd = time.time() - t0
    print(f"dense forward of {n} tokens: {t_fwd:.0f} s", flush=True)
    ids_t = torch.tensor(ids, device=dev)
    # Per full layer: summaries, true mass, statistics and T^s_t / T^s_{t+1} per (scorer, K).
    layers, sets, res = {}, {}, {}
    for li in full:
        k_l = rec.k[li]
        probs = metrics.attention_probs(rec.q_next[li], k_l, ts + 2)
        mass = metrics.block_mass(probs, bs, k_l.shape[1])
        ls = layers[li] = LayerScorers(args.scorers, k_l, bs, scale=model.model.layers[li].self_attn.scaling)
        layer_stats(ls, li, args.scorers, args.ks, rec.q_cur[li], rec.q_next[li], mass, ts, res, sets)
    # The correct draft through each scorer's resident set, in chunks of rows.
    variants = [(s, k) for s in args.scorers for k in args.ks]
    rec.mode = "draft"
    q_draft = {li: [] for li in full}
    rows = [(v, j) for v in variants for j in range(p_)]
    with torch.no_grad():
        for c0 in range(0, len(rows), args.draft_chunk):
            chunk = rows[c0 : c0 + args.draft_chunk]
            tpos = torch.stack([ts[j] for _, j in chunk])
            rec.pos = tpos + 1
            rec.masks = {}
            for li in full:
                rec.masks[li] = resident_mask(draft_sets(chunk, sets, li, max(args.ks)), tpos, n, bs)
            model(
                input_ids=ids_t[tpos + 1][:, None], position_ids=(tpos + 1)[:, None], use_cache=False, logits_to_keep=1
            )
            for li in full:
                q_draft[li].append(rec.q_draft[li])
    add_lookahead(layers, full, q_draft, variants, p_, sets, res, ts)
    table = result_rows(res, n, bs, lambda s: summary_bytes_per_token(s, cfg.head_dim, bs), width=11)
    from oasis_core import provenance  # $OASIS_COMMIT, else the checkout's HEAD

    commit = provenance.commit()
    doc = {
        "what": "block scorers on Gemma 3 270M full layers: mass, recall, proxy, correct-draft lookahead agreement",
        "weights": {"source": "real", "file": os.path.basename(args.model), "layers": full},
        "selection_source": "model (each scorer's own top-K)",
        "draft": "correct (the text's next token), sparse view: T^s_t + local block",
        "text": "Debian /usr/share/common-licenses, sorted, joined",
        "device": device_name(dev),
        "dtype": "float32",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "command": "python " + " ".join(sys.argv),
        "n_tokens": n,
        "positions": [int(ts[0]), int(ts[-1])],
        "block_size": bs,
        "elapsed_s": round(time.time() - t0, 1),
        "dense_forward_s": round(t_fwd, 1),
        "rows": table,
    }
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
