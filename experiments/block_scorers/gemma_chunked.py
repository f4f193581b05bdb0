"""Block scorers on Gemma 3 270M's full layers (5, 11, 17) at 32K on a CPU: ``gemma_hf.py``'s measurement with the
repo's own decoder (``oasis_exec.model.gemma3.Gemma3Decoder``, fp32) and a chunked prefill.

``gemma_hf.py`` runs transformers' one-shot SDPA forward: at 32K its sliding-window mask alone is a 32K x 32K tensor
and every sliding layer computes the full square. Here the prefill runs ``--chunk`` tokens at a time: a full layer
attends its whole cache ([chunk, S] mask, <= 1024 x 32K x 4 heads fp32 = 512 MB of scores), a sliding layer only
its last ``window + chunk`` keys; the cache keeps every full layer's K/V and a sliding layer's last ``window +
positions + 2`` (peak resident ~3 GB at 32K). Same definitions as ``gemma_hf.py`` (``scorer_stats``): per scorer and
K, mass, best-K mass, recall, proxy, adjacent, and the correct draft's lookahead agreement through the scorer's own
resident set (the draft row's full layers attend ``T^s_t`` + the local block + itself, its sliding layers their
window + itself).

    nice -n 10 python experiments/block_scorers/gemma_chunked.py --n-tokens 32768 --positions 16 \
        --out experiments/block_scorers/results/gemma_32k_cpu.json

Texts: ``licences`` (``gemma_licences_ids.json``, the earlier runs' text) or ``held:I`` (held-out window I of
``../long_context_draft/data/gemma_32k.npz``). ``--dump FILE`` also saves the caches and the full layers' queries at
t and t + 1, and ``--from-dump FILE`` starts from them (no prefill: scorers added later cost minutes); ``--calib FILE`` saves, for ``train:I`` texts, every full layer's
keys and a strided sample of its queries (what ``fit_basis.py`` fits the per-token scorer's bases on) and stops.
``--token-scorers NAME ...`` (with ``--bases calib/gemma3_270m_basis.npz``) adds the per-token scorer
(``oasis_core.token_scorer``) with those bases, reported as ``tokens:NAME`` (e.g. ``tokens:pairs64``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from scorer_runs import add_lookahead, device_name, draft_sets, layer_stats, result_rows, write_json  # noqa: E402

from oasis_core import token_scorer  # noqa: E402
from oasis_core.block_scorers import SCORERS, summary_bytes_per_token  # noqa: E402
from oasis_exec.tools.quality import metrics  # noqa: E402
from oasis_exec.tools.quality.draft_pass import draft_attention, resident_mask  # noqa: E402
from oasis_exec.tools.quality.scorer_stats import LayerScorers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
IDS_JSON = os.path.join(HERE, "gemma_licences_ids.json")
NPZ = os.path.join(HERE, "..", "long_context_draft", "data", "gemma_32k.npz")
BASES = os.path.join(HERE, "calib", "gemma3_270m_basis.npz")


def text_ids(name: str) -> list:
    if name == "licences":
        with open(IDS_JSON) as fh:
            return json.load(fh)["ids"]
    kind, i = name.split(":")
    return np.load(NPZ)[kind][int(i)].tolist()


def prefill(dec, ids, chunk: int, keep_q, keep_tail: int, q_every: int = 0):
    """Chunked causal forward. Returns (k, v, q, qs): k/v per layer [S_l, Hkv, D] (full layers every position,
    sliding layers the last ``keep_tail``), q per full layer at the positions ``keep_q`` [P, Hq, D], and qs per full
    layer every ``q_every``-th query (0: none)."""
    spec = dec.shape
    n = len(ids)
    ids = torch.tensor(ids)
    kc = [None] * spec.n_layers
    vc = [None] * spec.n_layers
    start = [0] * spec.n_layers  # absolute position of each cache's first entry
    q_keep = {i: [] for i in range(spec.n_layers) if spec.layer_window(i) is None}
    q_all = {i: [] for i in q_keep}
    g = spec.gqa_group
    for s0 in range(0, n, chunk):
        e = min(n, s0 + chunk)
        pos = torch.arange(s0, e)
        x = dec.embed_tokens(ids[s0:e])
        for i in range(spec.n_layers):
            q, k, v = dec.qkv(i, x, pos)
            kk = k if kc[i] is None else torch.cat([kc[i], k])
            vv = v if vc[i] is None else torch.cat([vc[i], v])
            kp = torch.arange(start[i], e)[None, :]
            qp = pos[:, None]
            mask = kp <= qp
            w = spec.layer_window(i)
            if w is not None:
                mask = mask & (kp > qp - w)
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                kk.transpose(0, 1)[None].repeat_interleave(g, 1),
                vv.transpose(0, 1)[None].repeat_interleave(g, 1),
                attn_mask=mask,
            )[0].transpose(0, 1)
            x = dec.finish(i, x, attn)
            if w is None:
                sel = [int(t) - s0 for t in keep_q if s0 <= int(t) < e]
                if sel:
                    q_keep[i].append(q[sel])
                if q_every:
                    q_all[i].append(q[(-s0) % q_every :: q_every])
            else:
                keep = max(w + chunk, keep_tail)
                if kk.shape[0] > keep:
                    kk, vv = kk[-keep:], vv[-keep:]
            kc[i], vc[i] = kk, vv
            start[i] = e - kk.shape[0]
        print(f"prefill {e}/{n}", flush=True)
    for i in range(spec.n_layers):
        if spec.layer_window(i) is not None:
            kc[i], vc[i] = kc[i][-keep_tail:], vc[i][-keep_tail:]
            start[i] = n - kc[i].shape[0]
    qs = {i: torch.cat(v) for i, v in q_all.items()} if q_every else None
    return kc, vc, start, {i: torch.cat(v) for i, v in q_keep.items()}, qs


def draft_pass(dec, tokens, pos, kc, vc, start, masks):
    """The draft rows (token at ``pos`` [R]) through every layer; full layers attend ``masks[i]`` [R, Hkv, T] of the
    recorded keys, sliding ones their window. Returns the full layers' draft queries [R, Hq, D]."""
    spec = dec.shape
    x = dec.embed_tokens(tokens)
    out = {}
    for i in range(spec.n_layers):
        q, k, v = dec.qkv(i, x, pos)
        w = spec.layer_window(i)
        if w is None:
            out[i] = q
            mask = masks[i]
        else:
            j = torch.arange(start[i], start[i] + kc[i].shape[0])[None, :]
            mask = ((j < pos[:, None]) & (j > pos[:, None] - w))[:, None, :]
        x = dec.finish(i, x, draft_attention(q, k, v, kc[i], vc[i], mask))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default="licences", help="licences | held:I | train:I (--calib only)")
    ap.add_argument("--n-tokens", type=int, default=32768)
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--ks", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--scorers", nargs="+", default=list(SCORERS), choices=SCORERS)
    ap.add_argument("--token-scorers", nargs="*", default=[], help="bases of --bases, e.g. pairs64 qpca64")
    ap.add_argument("--bases", default=BASES)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--draft-chunk", type=int, default=48, help="draft rows per forward (memory)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (every tensor made there: torch.set_default_device)")
    ap.add_argument("--no-draft", action="store_true", help="skip the lookahead draft pass")
    ap.add_argument("--dump", default=None, help="also save keys and queries (torch.save) here")
    ap.add_argument("--from-dump", default=None, help="a --dump of this text: skip the prefill")
    ap.add_argument("--calib", default=None, help="save the full layers' keys and every 8th query here and stop")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from oasis_exec.model.gemma3 import Gemma3Decoder, gemma3_path

    t0 = time.time()
    dev = torch.device(args.device)
    torch.set_default_device(dev)
    path = gemma3_path()
    dec = Gemma3Decoder.from_gguf(path, dtype=torch.float32, device=dev)
    spec = dec.shape
    full = [i for i in range(spec.n_layers) if spec.layer_window(i) is None]
    ids = text_ids(args.text)[: args.n_tokens]
    n, bs, p_ = len(ids), args.block_size, args.positions
    ts = torch.arange(n - 1 - p_, n - 1)
    keep_q = torch.cat([ts, ts[-1:] + 1])
    wmax = max(w for w in (spec.layer_window(i) for i in range(spec.n_layers)) if w is not None)
    if args.from_dump:  # a --dump of an earlier run of the same text: no prefill
        dump = torch.load(args.from_dump, map_location=dev)
        if dump["text"] != args.text or dump["n"] != n or not torch.equal(dump["ts"], ts):
            raise SystemExit(f"{args.from_dump}: another text, length or positions")
        if "kc" in dump:
            kc, vc, start, qk = dump["kc"], dump["vc"], dump["start"], dump["qk"]
        elif args.no_draft:  # the first dumps' format: full layers' keys and queries only
            kc, qk = dump["k"], {i: torch.cat([dump["q_cur"][i], dump["q_next"][i][-1:]]) for i in dump["k"]}
        else:
            raise SystemExit(f"{args.from_dump}: keys and queries only (an early dump): pass --no-draft")
    else:
        with torch.no_grad():
            kc, vc, start, qk, qs = prefill(dec, ids, args.chunk, keep_q, wmax + p_ + 2, 8 if args.calib else 0)
    t_fwd = time.time() - t0
    print(f"chunked prefill of {n} tokens: {t_fwd:.0f} s", flush=True)
    if args.calib:
        torch.save({"text": args.text, "n": n, "layers": full, "k": {i: kc[i] for i in full}, "q": qs}, args.calib)
        print(f"wrote {args.calib}")
        return 0
    if args.dump:
        torch.save({"text": args.text, "n": n, "ts": ts, "kc": kc, "vc": vc, "start": start, "qk": qk}, args.dump)
    q_cur = {i: qk[i][:-1] for i in full}
    q_next = {i: qk[i][1:] for i in full}
    ids_t = torch.tensor(ids)
    layers, sets, res = {}, {}, {}
    from fit_basis import load

    tok_names = [f"tokens:{b}" for b in args.token_scorers]
    scorers = list(args.scorers) + tok_names
    for li in full:
        k_l = kc[li]
        mass = metrics.block_mass(metrics.attention_probs(q_next[li], k_l, ts + 2), bs, k_l.shape[1])
        bases = {f"tokens:{b}": torch.tensor(load(args.bases, li, b, spec.head_dim)) for b in args.token_scorers}
        ls = layers[li] = LayerScorers(scorers, k_l, bs, scale=1.0 / spec.head_dim**0.5, bases=bases)
        layer_stats(ls, li, scorers, args.ks, q_cur[li], q_next[li], mass, ts, res, sets)
    variants = [(s, k) for s in scorers for k in args.ks]
    if not args.no_draft:
        rows = [(v, j) for v in variants for j in range(p_)]
        q_draft = {li: [] for li in full}
        with torch.no_grad():
            for c0 in range(0, len(rows), args.draft_chunk):
                chunk = rows[c0 : c0 + args.draft_chunk]
                tpos = torch.stack([ts[j] for _, j in chunk])
                masks = {}
                for li in full:
                    masks[li] = resident_mask(draft_sets(chunk, sets, li, max(args.ks)), tpos, n, bs)
                qd = draft_pass(dec, ids_t[tpos + 1], tpos + 1, kc, vc, start, masks)
                for li in full:
                    q_draft[li].append(qd[li])
        add_lookahead(layers, full, q_draft, variants, p_, sets, res, ts)

    def bytes_of(s: str) -> dict:
        if s not in tok_names:
            return summary_bytes_per_token(s, spec.head_dim, bs)
        per_tok = token_scorer.bytes_per_token(np.load(args.bases)[f"L{full[0]}_{s[7:]}"].shape[-1])
        kv = 2 * spec.head_dim * 2
        return {
            "needed": per_tok,
            "allocated": per_tok,
            "needed_frac_kv": per_tok / kv,
            "allocated_frac_kv": per_tok / kv,
        }

    table = result_rows(res, n, bs, bytes_of, width=16)
    from oasis_core import provenance

    doc = {
        "what": "block scorers on Gemma 3 270M full layers: mass, recall, proxy, correct-draft lookahead agreement",
        "weights": {"source": "real", "file": os.path.basename(path), "layers": full},
        "selection_source": "model (each scorer's own top-K)",
        "draft": "correct (the text's next token), sparse view: T^s_t + local block",
        "text": args.text,
        "device": device_name(dev),
        "dtype": "float32",
        "model_code": "oasis_exec.model.gemma3.Gemma3Decoder, chunked prefill",
        "bases": (os.path.relpath(args.bases) + ": " + str(np.load(args.bases)["meta"])) if tok_names else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": provenance.commit(),
        "command": "python " + " ".join(sys.argv),
        "n_tokens": n,
        "positions": [int(ts[0]), int(ts[-1])],
        "block_size": bs,
        "elapsed_s": round(time.time() - t0, 1),
        "prefill_s": round(t_fwd, 1),
        "from_dump": args.from_dump,
        "rows": table,
    }
    if args.out:
        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
