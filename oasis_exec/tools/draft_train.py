"""Train an EAGLE-3-style draft head for a real model by self-distillation (``oasis_exec.model.draft.draft_logits``).

    python -m oasis_exec.tools.draft_train corpus --model-path M.gguf --out prompts.npz      # here, on any machine
    python -m oasis_exec.tools.draft_train train --model-path M.gguf --corpus prompts.npz --out DIR --device cuda

``corpus``: prompts of ``--prompt-len`` tokens cut at seeded offsets from real text on this machine: CPython's
standard library sources and the text files of ``/usr/share/doc`` (Debian documentation; ``copyright`` files are
left out, and so are the evaluation texts of ``traces/texts/``). Files are split into train and held-out by a hash of
their path, so no held-out file's text is ever trained on. Nothing is downloaded.

``train``: (1) the target continues every prompt greedily for ``--gen-len`` tokens (batched, with a plain KV cache)
-- the head learns the target's own distribution, as EAGLE's self-distillation does; (2) one teacher-forced pass
gives, per position p, the features the engine hands the head (the residual after the ``aux_layers``) and the
target's logits at p + 1; (3) the head is trained on (features at p, embedding of token p + 1) -> the target's
next-token distribution at p + 1 (soft cross-entropy), which is what ``Runner`` asks of it at every decode step.
Reported: first-token acceptance (draft argmax == target argmax) on the held-out generated sequences and on held-out
real text, teacher forced. ``DIR`` gets ``model.safetensors`` + ``config.json`` (with the provenance) + ``train.json``.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import json
import logging
import math
import os
import sys
import time

import numpy as np
import torch

from oasis_core.cliargs import one_line

from ..model.decoder import Decoder
from ..model.draft import NAMES, DraftHead, aux_layers, draft_logits
from ..model.gguf import sha256_file

log = logging.getLogger(__name__)

EVAL_TEXT_FILES = ("argparse.py", "shlex.py")  # CPython files among traces/texts/ (the licences are not in the pool)


def corpus_files(stdlib: str | None = None, doc_root: str = "/usr/share/doc") -> list[str]:
    """Real text files of this machine: stdlib ``*.py`` (tests and the evaluation texts excluded) and Debian docs."""
    import sysconfig

    stdlib = stdlib or sysconfig.get_paths()["stdlib"]
    out = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "idlelib", "site-packages", "__pycache__"))
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py") and f not in EVAL_TEXT_FILES]
    for root, dirs, files in os.walk(doc_root):
        dirs.sort()
        for f in sorted(files):
            base = f[:-3] if f.endswith(".gz") else f
            if base == "copyright" or base.startswith("changelog"):
                continue
            if base.startswith(("README", "NEWS")) or base.endswith((".md", ".txt", ".rst")):
                out.append(os.path.join(root, f))
    return out


def read_text(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="replace")


def held_out(path: str, fraction: float = 0.1) -> bool:
    return int(hashlib.sha256(os.path.basename(path).encode()).hexdigest()[:8], 16) / 2**32 < fraction


def build_corpus(tokenize, files, n_train: int, n_held: int, length: int, seed: int = 0) -> dict:
    """Prompts [n, length] (int32) cut from the files at seeded offsets, train and held-out files apart."""
    rng = np.random.default_rng(seed)
    pools = {"train": [], "held": []}
    for f in files:
        try:
            ids = tokenize(read_text(f))
        except OSError:
            continue
        if len(ids) >= length:
            pools["held" if held_out(f) else "train"].append((f, np.asarray(ids, dtype=np.int32)))
    out = {}
    for split, n in (("train", n_train), ("held", n_held)):
        pool = pools[split]
        if not pool:
            raise ValueError(f"no {split} file of >= {length} tokens among {len(files)} files")
        w = np.array([len(ids) - length + 1 for _, ids in pool], dtype=np.float64)
        pick = rng.choice(len(pool), size=n, p=w / w.sum())
        rows, srcs = [], []
        for i in pick:
            f, ids = pool[i]
            o = int(rng.integers(0, len(ids) - length + 1))
            rows.append(ids[o : o + length])
            srcs.append(f)
        out[split] = np.stack(rows)
        out[split + "_files"] = np.array(sorted(set(srcs)))
    return out


# -- the target: batched greedy generation and teacher-forced features -------------------------------------------


@torch.inference_mode()
def forward_batch(dec: Decoder, tokens, want=(), cache=None, start=0):
    """``Decoder.forward`` of tokens [B, T] (``cache``/``start`` as there) -> (logits [B, T, V], {layer: residual
    after it [B, T, hidden]} for the layers in ``want``)."""
    B, T = tokens.shape
    feats = {}

    def keep(i, q, k, v, x):
        if i in want:
            feats[i] = x.view(B, T, -1)

    return dec.forward(tokens, keep, cache, start), feats


@torch.inference_mode()
def generate_greedy(dec: Decoder, prompts, new_tokens: int, batch: int = 256, progress=None):
    """Greedy continuation of equal-length prompts [N, P] -> [N, P + new_tokens]."""
    outs = []
    for b0 in range(0, prompts.shape[0], batch):
        seq = prompts[b0 : b0 + batch]
        cache = []
        logits, _ = forward_batch(dec, seq, cache=cache)
        nxt = logits[:, -1].argmax(-1)
        toks = [nxt]
        for j in range(new_tokens - 1):
            logits, _ = forward_batch(dec, nxt[:, None], cache=cache, start=seq.shape[1] + j)
            nxt = logits[:, -1].argmax(-1)
            toks.append(nxt)
        outs.append(torch.cat([seq, torch.stack(toks, 1)], 1))
        if progress:
            progress(min(b0 + batch, prompts.shape[0]), prompts.shape[0])
    return torch.cat(outs)


@torch.inference_mode()
def features(dec: Decoder, seqs, batch: int = 64):
    """Per sequence position p: aux features [N, T, 3h] (bf16) and the final residual [N, T, h] (the target's logits
    at p come from it through ``Decoder.logits``)."""
    layers = aux_layers(dec.shape.n_layers)
    want = set(layers) | {dec.shape.n_layers - 1}
    aux, last = [], []
    for b0 in range(0, seqs.shape[0], batch):
        _, fe = forward_batch(dec, seqs[b0 : b0 + batch], want=want)
        aux.append(torch.cat([fe[i] for i in layers], -1).to(torch.bfloat16))
        last.append(fe[dec.shape.n_layers - 1].to(torch.bfloat16))
    return torch.cat(aux), torch.cat(last)


# -- the head -----------------------------------------------------------------------------------------------------


def init_head(dec: Decoder, mlp_hidden: int, seed: int = 0, device="cpu") -> dict:
    s, h = dec.shape, dec.shape.hidden
    g = torch.Generator().manual_seed(seed)

    def mat(r, c, scale=1.0):
        return (torch.randn(r, c, generator=g) * scale / math.sqrt(c)).to(device)

    w = {
        "fc.weight": mat(h, 3 * h),
        "midlayer.self_attn.v_proj.weight": mat(s.n_kv_heads * s.head_dim, 2 * h),
        "midlayer.self_attn.o_proj.weight": mat(h, s.n_q_heads * s.head_dim, 0.5),
        "midlayer.mlp.gate_proj.weight": mat(mlp_hidden, h),
        "midlayer.mlp.up_proj.weight": mat(mlp_hidden, h),
        "midlayer.mlp.down_proj.weight": mat(h, mlp_hidden, 0.5),
    }
    for n in (
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
    ):
        w[n] = torch.ones(h, device=device)
    assert set(w) == set(NAMES)
    return w


def _batches(n_rows, T, bs, gen):
    """Positions (row, p) with p in [0, T - 2]: features at p, token p + 1, target at p + 1."""
    while True:
        r = torch.randint(0, n_rows, (bs,), generator=gen)
        p = torch.randint(0, T - 1, (bs,), generator=gen)
        yield r, p


def train_head(
    dec: Decoder, seqs, aux, last, steps: int, batch: int, lr: float, mlp_hidden: int, seed: int = 0, log=None
) -> dict:
    """Soft cross-entropy against the target's next-token distribution; AdamW with cosine decay. float32 master
    weights, bf16 autocast on CUDA. ``log(message)``: the progress notes (default: this module's logger, INFO)."""
    if log is None:
        log = logging.getLogger(__name__).info
    dev = dec.device
    w = {k: v.float().requires_grad_(True) for k, v in init_head(dec, mlp_hidden, seed, dev).items()}
    opt = torch.optim.AdamW(list(w.values()), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))
    )
    lm = dec.lm_head.detach()
    gen = torch.Generator().manual_seed(seed)
    it = _batches(seqs.shape[0], seqs.shape[1], batch, gen)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    t0 = time.time()
    for i in range(steps):
        r, p = next(it)
        r, p = r.to(dev), p.to(dev)
        with torch.no_grad():
            tgt = dec.logits(last[r, p + 1].to(dec.dtype)).float()
            tgt_p = torch.softmax(tgt, -1)
        with amp:
            lg = draft_logits(
                {k: v.to(dec.dtype) if dev.type != "cuda" else v for k, v in w.items()},
                dec.shape,
                aux[r, p].to(dec.dtype),
                dec.embed[seqs[r, p + 1]].detach(),
                lm,
            )
        loss = -(tgt_p * torch.log_softmax(lg.float(), -1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        sched.step()
        if i % max(1, steps // 20) == 0 or i == steps - 1:
            acc = (lg.argmax(-1) == tgt.argmax(-1)).float().mean().item()
            log(f"step {i:5d}/{steps}  loss {loss.item():.3f}  batch acceptance {acc:.3f}  {time.time() - t0:.0f}s")
    return {k: v.detach() for k, v in w.items()}


@torch.inference_mode()
def acceptance(dec: Decoder, head: DraftHead, seqs, batch: int = 64, skip: int = 0) -> dict:
    """Teacher-forced first-token acceptance over positions p >= skip: draft(feats p, token p + 1) == target argmax
    at p + 1. Also the rate at which the target's own greedy token equals the sequence's next token."""
    hits = n = 0
    for b0 in range(0, seqs.shape[0], batch):
        s = seqs[b0 : b0 + batch]
        logits, fe = forward_batch(dec, s, want=set(head.layers))
        a = torch.cat([fe[i] for i in head.layers], -1)[:, skip:-1]
        tok = s[:, skip + 1 :]
        d = head.propose(a.reshape(-1, a.shape[-1]), tok.reshape(-1))
        tgt = logits[:, skip + 1 :].argmax(-1).reshape(-1)
        hits += int((d == tgt).sum())
        n += d.numel()
    return {"acceptance": hits / max(n, 1), "positions": n}


# -- CLI ----------------------------------------------------------------------------------------------------------


def _tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        os.path.dirname(os.path.abspath(model_path)), gguf_file=os.path.basename(model_path)
    )


def cmd_corpus(a) -> int:
    tok = _tokenizer(a.model_path)
    files = corpus_files()
    log.info("%d candidate files", len(files))
    c = build_corpus(
        lambda t: tok(t, add_special_tokens=False).input_ids, files, a.n_train, a.n_held, a.prompt_len, a.seed
    )
    extra = {}
    for name in a.held_texts or []:
        ids = np.asarray(tok(read_text(name), add_special_tokens=False).input_ids[: a.held_text_tokens], np.int32)
        extra["text:" + os.path.basename(name)] = ids
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    np.savez_compressed(a.out, **c, **extra)
    log.info(
        "wrote %s: train %s from %d files, held %s from %d files; texts %s",
        a.out,
        c["train"].shape,
        len(c["train_files"]),
        c["held"].shape,
        len(c["held_files"]),
        list(extra),
    )
    return 0


def read_corpus(path: str) -> dict:
    """The ``train`` and ``held`` prompt arrays [N, T] of a corpus ``.npz`` (``cmd_corpus`` writes it)."""
    from oasis_core.recording import read_npz

    from ..model.files import ModelFileError

    z = read_npz(path, ModelFileError)
    for k in ("train", "held"):
        if k not in z or z[k].ndim != 2 or not np.issubdtype(z[k].dtype, np.integer):
            raise ModelFileError(f"{path}: {k}: must be an integer array [prompts, tokens] (a draft_train corpus)")
    return z


def cmd_train(a) -> int:
    dev = torch.device(a.device)
    dt = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    torch.manual_seed(a.seed)
    dec = Decoder.from_path(a.model_path, dt, dev, fused=False)
    z = read_corpus(a.corpus)
    train_p = torch.from_numpy(z["train"][: a.n_train].astype(np.int64)).to(dev)
    held_p = torch.from_numpy(z["held"][: a.n_held].astype(np.int64)).to(dev)
    note = log.info
    t0 = time.time()
    prog = lambda i, n: note(f"  generated {i}/{n}")  # noqa: E731
    train_s = generate_greedy(dec, train_p, a.gen_len, a.gen_batch, prog)
    held_s = generate_greedy(dec, held_p, a.gen_len, a.gen_batch)
    t_gen = time.time() - t0
    note(f"self-distillation text: {tuple(train_s.shape)} train, {tuple(held_s.shape)} held out, {t_gen:.0f}s")
    aux, last = features(dec, train_s)
    w = train_head(dec, train_s, aux, last, a.steps, a.batch, a.lr, a.mlp_hidden, a.seed, note)
    del aux, last
    head = DraftHead(dec.shape, {k: v.to(torch.bfloat16) for k, v in w.items()}, dec.embed, dec.lm_head)
    head_eval = DraftHead(dec.shape, {k: v.to(dt) for k, v in w.items()}, dec.embed, dec.lm_head)
    P = train_p.shape[1]
    res = {
        "held_generated": acceptance(dec, head_eval, held_s, skip=P - 1),
        "held_prompts_real_text": acceptance(dec, head_eval, held_p),
    }
    for k in z.files:
        if k.startswith("text:"):
            ids = torch.from_numpy(z[k].astype(np.int64)).to(dev)[None]
            res[k] = acceptance(dec, head_eval, ids)
    prov = {
        "model": os.path.basename(a.model_path),
        "model_sha256": sha256_file(a.model_path),
        "corpus": os.path.basename(a.corpus),
        "corpus_sha256": sha256_file(a.corpus),
        "train_prompts": int(train_p.shape[0]),
        "prompt_len": int(P),
        "gen_len": a.gen_len,
        "steps": a.steps,
        "batch": a.batch,
        "lr": a.lr,
        "mlp_hidden": a.mlp_hidden,
        "seed": a.seed,
        "dtype": a.dtype,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "command": " ".join(sys.argv),
        "seconds": round(time.time() - t0, 1),
        "acceptance": res,
    }
    head.save(a.out, {"provenance": prov})
    with open(os.path.join(a.out, "train.json"), "w") as fh:
        json.dump(prov, fh, indent=1)
    print(json.dumps(res, indent=1))
    return 0


def main(argv=None) -> int:
    from oasis_core.cliargs import OneLineParser

    ap = OneLineParser(prog="python -m oasis_exec.tools.draft_train", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="prompts from real text on this machine (train / held-out files apart)")
    c.add_argument("--model-path", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--n-train", type=int, default=4096)
    c.add_argument("--n-held", type=int, default=256)
    c.add_argument("--prompt-len", type=int, default=128)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--held-texts", nargs="*", help="whole files for held-out acceptance (e.g. traces/texts/*)")
    c.add_argument("--held-text-tokens", type=int, default=4096)
    t = sub.add_parser("train", help="self-distillation and training of the head")
    t.add_argument("--model-path", required=True)
    t.add_argument("--corpus", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--device", default="cuda")
    t.add_argument("--dtype", default="bfloat16")
    t.add_argument("--n-train", type=int, default=4096)
    t.add_argument("--n-held", type=int, default=256)
    t.add_argument("--gen-len", type=int, default=256)
    t.add_argument("--gen-batch", type=int, default=512)
    t.add_argument("--steps", type=int, default=3000)
    t.add_argument("--batch", type=int, default=2048)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--mlp-hidden", type=int, default=1024)
    t.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        check_args(a)
    except ValueError as e:
        print(f"{ap.prog} {a.cmd}: error: {one_line(e)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # progress notes on stderr
    return cmd_corpus(a) if a.cmd == "corpus" else cmd_train(a)


def check_args(a) -> None:
    """Bounds, paths and the device of either subcommand, before the model is loaded (``oasis_exec.cli_checks``)."""
    from oasis_exec import cli_checks as c

    counts = ("n_train", "n_held", "prompt_len", "held_text_tokens", "gen_len", "gen_batch", "steps", "batch")
    c.bounds(a, {k: (1, None, False) for k in counts + ("mlp_hidden",)} | {"lr": (0, None, True)})
    c.existing(a, "model_path")
    if a.cmd == "corpus":
        for f in a.held_texts or ():
            if not os.path.isfile(f):
                raise ValueError(f"--held-texts: no such file, got {f!r}")
        c.writable_file(a, "out")
    else:
        c.existing(a, "corpus", kind="file")
        read_corpus(a.corpus)  # a corrupt corpus is refused before the model loads
        c.device(a)
        from oasis_exec.config import DTYPES

        if a.dtype not in DTYPES:
            raise ValueError(f"--dtype: must be one of {', '.join(DTYPES)}, got {a.dtype!r}")
        c.writable_dir(a, "out")


if __name__ == "__main__":
    sys.exit(main())
