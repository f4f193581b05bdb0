"""Train a draft head for long context by self-distillation (issue 37), either kind: ``attn`` (the full EAGLE-3
layer, ``oasis_exec.model.draft_attn``) or ``single`` (today's single-key head, ``oasis_exec.model.draft``).

    python experiments/long_context_draft/train_long.py corpus --model-path M.gguf --seq-len 8192 --out D.npz
    python experiments/long_context_draft/train_long.py train --model-path M.gguf --data D.npz --out DIR

``corpus`` (here, on the CPU; nothing downloaded): real text of this machine -- CPython's standard library sources
and the text files of ``/usr/share/doc`` (``oasis_exec.tools.draft_train.corpus_files``: copyright files, changelogs,
tests and the CPython evaluation texts left out), split train / held-out by a hash of the file name, shuffled (seeded)
and joined with blank lines, tokenized, and cut into ``--n-train`` / ``--n-held`` consecutive windows of ``--seq-len``
tokens (no two overlap when the files hold enough text; else random windows, ``_windows``). The evaluation texts are held out and
named: ``text:licences``, the Debian common licences joined (``/usr/share/common-licenses``: never in the training
pool), and the held-out windows. Ids are stored as uint16 when the vocabulary fits, else int32.

``train`` (the H200; ``device_step.sh``): (1) the target (transformers, from the GGUF) continues ``--n-gen`` of the
training windows by itself: the prefix is the window's first ``seq_len - gen_len`` tokens, the last ``--gen-len``
its own (half greedy, half sampled at T = 0.7): the model's own long continuations; (2) one teacher-forced pass per
sequence (the real windows and the continued ones) keeps, at every position, the features the engine hands the
head and the target's final normed hidden state (its logits come from it at the picked positions); (3) the head
learns, at random entries p of whole sequences (``--seqs`` a step, ``--picks`` entries a step, positions 0 ..
seq_len - 2: up to the model's limit), the target's distribution at p + 1 (soft cross-entropy, AdamW, cosine over
``--steps`` or ``--max-seconds``, whichever ends first; with ``--val-windows V`` the V training windows after the
``--n-train`` used are scored every ``--val-every`` steps and the best check's weights are kept: the first heads, on
24 / 64 windows, fitted their text, 59% on training windows against 35% held out); (4) acceptance by position bucket
(``accept_buckets.evaluate``) for the new head and each ``--compare`` head. ``DIR`` gets ``model.safetensors``, ``config.json`` (provenance) and
``accept.json``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # this folder and the repository root
from accept_buckets import evaluate, table  # noqa: E402
from longctx import Target, load_data, load_head, train_logits  # noqa: E402

from oasis_exec.model.draft import DraftHead  # noqa: E402
from oasis_exec.model.draft_attn import ATTN_NAMES, AttnDraftHead, AttnShape  # noqa: E402
from oasis_exec.tools.draft_train import corpus_files, held_out, read_text  # noqa: E402

LICENCES = "/usr/share/common-licenses"


def _tokenizer(model_path):
    from transformers import AutoTokenizer

    d, f = os.path.split(os.path.abspath(model_path))
    return (
        AutoTokenizer.from_pretrained(d, gguf_file=f)
        if f.endswith(".gguf")
        else AutoTokenizer.from_pretrained(model_path)
    )


def _stream(tok, files, need: int, seed: int) -> np.ndarray:
    """Token ids of ``files`` shuffled and joined, at least ``need`` of them when the files hold that many."""
    rng = np.random.default_rng(seed)
    ids, n = [], 0
    for i in rng.permutation(len(files)):
        try:
            t = tok(read_text(files[i]) + "\n\n", add_special_tokens=False).input_ids
        except (OSError, UnicodeDecodeError):
            continue
        ids.append(np.asarray(t, dtype=np.int64))
        n += len(t)
        if n >= need:
            break
    return np.concatenate(ids)


def _windows(stream: np.ndarray, n: int, length: int, seed: int) -> np.ndarray:
    """``n`` windows of ``length`` tokens: consecutive, non-overlapping ones when the stream holds them (in a seeded
    order), else at seeded random starts (they may overlap)."""
    if len(stream) < length:
        raise ValueError(f"the text holds {len(stream)} tokens, fewer than one window of {length}")
    rng = np.random.default_rng(seed)
    if len(stream) >= n * length:
        order = rng.permutation(len(stream) // length)[:n]
        return np.stack([stream[i * length : (i + 1) * length] for i in order])
    starts = rng.integers(0, len(stream) - length + 1, size=n)
    return np.stack([stream[s : s + length] for s in starts])


def cmd_corpus(a) -> int:
    tok = _tokenizer(a.model_path)
    files = corpus_files()
    train = [f for f in files if not held_out(f)]
    held = [f for f in files if held_out(f)]
    T = a.seq_len
    tr = _windows(_stream(tok, train, a.n_train * T + T, a.seed), a.n_train, T, a.seed + 1)
    he = _windows(_stream(tok, held, a.n_held * T + T, a.seed + 2), a.n_held, T, a.seed + 3)
    lic = sorted(os.path.join(LICENCES, f) for f in os.listdir(LICENCES)) if os.path.isdir(LICENCES) else []
    out = {"train": tr, "held": he, "held_files": np.array(sorted(os.path.basename(f) for f in held))}
    if lic:
        text = "\n\n".join(read_text(f) for f in lic if os.path.isfile(f))
        out["text:licences"] = np.asarray(tok(text, add_special_tokens=False).input_ids[:T], dtype=np.int64)
    dt = np.uint16 if len(tok) <= 65535 else np.int32
    np.savez_compressed(a.out, **{k: (v.astype(dt) if v.dtype == np.int64 else v) for k, v in out.items()})
    print(
        f"wrote {a.out}: train {tr.shape}, held {he.shape} ({len(held)} held-out files), licences "
        f"{len(out.get('text:licences', []))} tokens, {dt.__name__}, {os.path.getsize(a.out)} bytes"
    )
    return 0


# -- training ---------------------------------------------------------------------------------------------------------


def init_weights(kind: str, spec, attn: AttnShape, mlp_hidden: int, seed: int, device) -> dict:
    h = spec.hidden
    g = torch.Generator().manual_seed(seed)

    def mat(r, c, scale=1.0):
        return (torch.randn(r, c, generator=g) * scale / math.sqrt(c)).to(device)

    w = {
        "fc.weight": mat(h, 3 * h),
        "midlayer.self_attn.v_proj.weight": mat(attn.n_kv_heads * attn.head_dim, 2 * h),
        "midlayer.self_attn.o_proj.weight": mat(h, attn.n_heads * attn.head_dim, 0.5),
        "midlayer.mlp.gate_proj.weight": mat(mlp_hidden, h),
        "midlayer.mlp.up_proj.weight": mat(mlp_hidden, h),
        "midlayer.mlp.down_proj.weight": mat(h, mlp_hidden, 0.5),
    }
    if kind == "attn":
        w["midlayer.self_attn.q_proj.weight"] = mat(attn.n_heads * attn.head_dim, 2 * h)
        w["midlayer.self_attn.k_proj.weight"] = mat(attn.n_kv_heads * attn.head_dim, 2 * h)
    else:  # the single-key head's value projection feeds every query head of its group: the target's GQA shape
        w["midlayer.self_attn.v_proj.weight"] = mat(spec.n_kv_heads * spec.head_dim, 2 * h)
        w["midlayer.self_attn.o_proj.weight"] = mat(h, spec.n_q_heads * spec.head_dim, 0.5)
    for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[f"midlayer.{n}.weight"] = torch.ones(h, device=device)
    w["norm.weight"] = torch.ones(h, device=device)
    assert set(w) == set(ATTN_NAMES if kind == "attn" else ATTN_NAMES[:-2])
    return w


def start_from(path: str, fresh: dict, device) -> dict:
    """A saved head's weights (``--init``) in place of the fresh ones: the same names and shapes, or SystemExit."""
    from oasis_exec.model.decoder import load_safetensors_dir

    got = load_safetensors_dir(path, torch.float32, device)
    if set(got) != set(fresh):
        raise SystemExit(f"--init {path}: its weights {sorted(set(got) ^ set(fresh))} differ from this head's")
    bad = [k for k in fresh if got[k].shape != fresh[k].shape]
    if bad:
        raise SystemExit(
            f"--init {path}: {bad[0]} is {tuple(got[bad[0]].shape)}, this head's {tuple(fresh[bad[0]].shape)}"
        )
    return got


def self_distillation_set(target: Target, data: dict, a, log) -> torch.Tensor:
    """The real training windows and the target's own continuations of ``--n-gen`` of them -> [N, T] (device)."""
    real = torch.as_tensor(data["train"][: a.n_train, : a.seq_len], device=target.device)
    T, G = real.shape[1], min(a.gen_len, real.shape[1] - 1)
    gen = []
    for i in range(0, a.n_gen, a.gen_batch):
        rows = real[i : min(i + a.gen_batch, a.n_gen), : T - G]
        temp = 0.0 if (i // a.gen_batch) % 2 == 0 else 0.7
        gen.append(target.generate(rows, G, temp, seed=a.seed + i))
        log(f"generated {min(i + a.gen_batch, a.n_gen)}/{a.n_gen} continuations (T={temp}), {time.time() - T0:.0f}s")
    return torch.cat([real] + gen) if gen else real


def train(target: Target, seqs, a, log) -> tuple[dict, AttnShape]:
    spec, dev = target.spec, target.device
    attn = AttnShape(
        a.heads or spec.n_q_heads, a.kv_heads or spec.n_kv_heads, a.head_dim or spec.head_dim, a.rope_theta or 1e6
    )
    feats, hns = [], []
    for i in range(0, seqs.shape[0], a.feat_batch):
        x, hn = target.features(seqs[i : i + a.feat_batch])
        feats.append(x.clone())
        hns.append(hn.clone())
    aux, hn = torch.cat(feats), torch.cat(hns)
    del feats, hns
    log(
        f"features {tuple(aux.shape)} {aux.dtype}, {aux.numel() * aux.element_size() / 2**30:.2f} GiB, {time.time() - T0:.0f}s"
    )
    val = _validation(target, a, attn, log)
    w0 = init_weights(a.head, spec, attn, a.mlp_hidden, a.seed, dev)
    if a.init:
        w0 = start_from(a.init, w0, dev)
        log(f"weights from {a.init} (training goes on from them)")
    w = {k: v.float().requires_grad_(True) for k, v in w0.items()}
    best = (-1.0, -1, None)  # validation acceptance, step, weights
    opt = torch.optim.AdamW(list(w.values()), lr=a.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = min(100, a.steps // 10 + 1)
    lm = target.lm_head.detach()
    N, T, _ = aux.shape
    gen = torch.Generator().manual_seed(a.seed)
    t0, done = time.time(), 0
    for i in range(a.steps):
        # progress: steps or seconds, whichever binds first, so that the cosine decay ends either way
        progress = max(i / a.steps, (time.time() - t0) / a.max_seconds)
        if progress >= 1:
            log(f"stopped at step {i} of {a.steps}: --max-seconds {a.max_seconds} reached")
            break
        for grp in opt.param_groups:
            grp["lr"] = a.lr * min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * progress))
        rows = torch.randint(0, N, (a.seqs,), generator=gen).to(dev)
        x = aux[rows, : T - 1]  # entries 0 .. T - 2
        emb = target.embed[seqs[rows, 1:]]  # token p + 1
        pick = torch.randint(0, a.seqs * (T - 1), (a.picks,), generator=gen).to(dev)
        b, p = pick // (T - 1), pick % (T - 1)
        with torch.no_grad():
            tgt_p = torch.softmax(target.logits(hn[rows[b], p + 1]), -1)
        lg = head_logits(w, a.head, attn, spec, x, emb, pick, lm)
        loss = -(tgt_p * torch.log_softmax(lg.float(), -1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        done = i + 1
        if val is not None and (done % a.val_every == 0 or done == a.steps):
            best = _keep_best(best, val(w), done, w, log)
        if i % max(1, a.steps // 20) == 0 or i == a.steps - 1:
            acc = (lg.argmax(-1) == tgt_p.argmax(-1)).float().mean().item()
            log(
                f"step {i:5d}/{a.steps}  loss {loss.item():.3f}  batch acceptance {acc:.3f}  lr {grp['lr']:.2e}  "
                f"{time.time() - t0:.0f}s"
            )
    a.steps_done = done
    if val is not None:
        if done % a.val_every != 0 and done != a.steps:  # stopped by --max-seconds between two checks
            best = _keep_best(best, val(w), done, w, log)
        a.val_best_step, a.val_best_acceptance = best[1], round(best[0], 4)
        log(f"kept the weights of step {best[1]} (validation acceptance {best[0]:.3f})")
        return best[2], attn
    return {k: v.detach() for k, v in w.items()}, attn


def head_logits(w: dict, kind: str, attn: AttnShape, spec, x, emb, pick, lm):
    """``train_logits`` at the run's precision: on CUDA the float32 weights under bf16 autocast with bf16 features,
    on the CPU the weights cast to the features' dtype (training and validation share it)."""
    if x.device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return train_logits(w, kind, attn, spec, x.to(torch.bfloat16), emb, pick, lm)
    return train_logits({k: v.to(x.dtype) for k, v in w.items()}, kind, attn, spec, x, emb, pick, lm)


def _validation(target: Target, a, attn: AttnShape, log):
    """``--val-windows``: the training pool's next windows after ``--n-train`` (never trained on) -> a function of
    the weights giving the head's acceptance (top-1 = the target's) at ``--val-picks`` fixed entries, or None."""
    if not a.val_windows:
        return None
    pool = a.train_pool  # enough windows: checked by cmd_train
    seqs = torch.as_tensor(pool[a.n_train : a.n_train + a.val_windows, : a.seq_len], device=target.device)
    B, T = seqs.shape
    gen = torch.Generator().manual_seed(a.seed + 7)
    pick = torch.randint(0, B * (T - 1), (min(a.val_picks, B * (T - 1)),), generator=gen).to(target.device)
    log(f"validation: {B} windows after the {a.n_train} trained, {len(pick)} entries")
    return acceptance_at(target, a.head, attn, seqs, pick)


def acceptance_at(target: Target, kind: str, attn: AttnShape, seqs, pick):
    """A function of a head's weights -> its acceptance (top-1 = the target's) at entries ``pick`` (flat indices
    ``b * (T - 1) + p``: the head's guess after entry p of row b) of ``seqs`` [B, T], through ``head_logits``; the
    target's features and answers are computed once."""
    aux, hn = target.features(seqs)
    T = seqs.shape[1]
    want = target.logits(hn[pick // (T - 1), pick % (T - 1) + 1]).argmax(-1)
    emb = target.embed[seqs[:, 1:]]
    lm = target.lm_head.detach()

    def acceptance(w) -> float:
        with torch.no_grad():
            lg = head_logits(w, kind, attn, target.spec, aux[:, : T - 1], emb, pick, lm)
        return (lg.argmax(-1) == want).float().mean().item()

    return acceptance


def _keep_best(best, acc: float, step: int, w: dict, log):
    log(f"validation at step {step}: acceptance {acc:.3f}")
    return (acc, step, {k: v.detach().clone() for k, v in w.items()}) if acc > best[0] else best


def _sha(path: str) -> str:
    """sha256 of a file, or of a directory's files in name order (a Hugging Face directory)."""
    h = hashlib.sha256()
    files = [os.path.join(path, f) for f in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
    for f in files:
        if os.path.isfile(f):
            with open(f, "rb") as fh:
                for b in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(b)
    return h.hexdigest()


def cmd_train(a) -> int:
    global T0
    T0 = time.time()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    dev = torch.device(a.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(a.seed)
    data = load_data(a.data)  # checked before the target loads (a GGUF takes a while)
    a.train_pool = data["train"]
    if not 1 <= a.n_train <= len(a.train_pool) or not 0 <= a.n_gen <= a.n_train:
        raise SystemExit(
            f"--n-train {a.n_train} / --n-gen {a.n_gen}: {a.data} holds {len(a.train_pool)} training windows "
            "(need 1 <= n-train <= that, 0 <= n-gen <= n-train)"
        )
    if a.val_windows and len(a.train_pool) < a.n_train + a.val_windows:
        raise SystemExit(
            f"--val-windows {a.val_windows}: {a.data} holds {len(a.train_pool)} training windows, --n-train uses "
            f"{a.n_train}"
        )
    target = Target(a.model_path, dev, dt)
    a.seq_len = min(a.seq_len or data["train"].shape[1], data["train"].shape[1], target.max_positions)
    log(
        f"target {os.path.basename(a.model_path)}: {target.n_layers} layers, hidden {target.spec.hidden}, vocab "
        f"{target.spec.vocab}, {target.max_positions} positions; sequences of {a.seq_len}; {time.time() - T0:.0f}s"
    )
    seqs = self_distillation_set(target, data, a, log)
    w, attn = train(target, seqs, a, log)
    del seqs
    wd = {k: v.to(torch.bfloat16) for k, v in w.items()}
    cls = AttnDraftHead if a.head == "attn" else DraftHead
    head = (
        cls(target.spec, wd, target.embed, target.lm_head, attn)
        if a.head == "attn"
        else cls(target.spec, wd, target.embed, target.lm_head)
    )
    prov = {
        "model": os.path.basename(a.model_path),
        "model_sha256": _sha(a.model_path),
        "data": os.path.basename(a.data),
        "data_sha256": _sha(a.data),
        "head": a.head,
        "seq_len": a.seq_len,
        "n_train_windows": a.n_train,
        "n_generated": a.n_gen,
        "gen_len": a.gen_len,
        "gen_temperatures": [0.0, 0.7],
        "steps": a.steps,
        "steps_done": a.steps_done,
        "seqs_per_step": a.seqs,
        "picks_per_step": a.picks,
        "lr": a.lr,
        "mlp_hidden": a.mlp_hidden,
        "seed": a.seed,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": str(dt),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": os.environ.get("OASIS_COMMIT", "unknown"),
        "command": " ".join(sys.argv),
        "train_seconds": round(time.time() - T0, 1),
    }
    if a.init:  # the run it went on from: its own provenance, and the bytes it started from
        with open(os.path.join(a.init, "config.json")) as fh:
            prov["init"] = {
                "path": a.init,
                "model_safetensors_sha256": _sha(os.path.join(a.init, "model.safetensors")),
                "provenance": json.load(fh).get("provenance"),
            }
    if a.val_windows:
        prov.update(
            val_windows=a.val_windows,
            val_every=a.val_every,
            val_best_step=a.val_best_step,
            val_best_acceptance=a.val_best_acceptance,
        )
    extra = {"provenance": prov}
    if a.head == "single":
        extra["draft_head"] = "single"
    head.save(a.out, extra)
    log(f"saved {a.out}, {time.time() - T0:.0f}s")
    if a.eval_gen >= 0:
        heads = {f"new-{a.head}": load_head(a.out, target.spec, target, dt, dev, a.seq_len)}
        for p in a.compare or []:
            heads[os.path.basename(p.rstrip("/"))] = load_head(p, target.spec, target, dt, dev, a.seq_len)
        res = evaluate(target, heads, data, a.seq_len, a.eval_gen, n_gen_seqs=a.eval_seqs, log=log)
        print(table(res))
        with open(os.path.join(a.out, "accept.json"), "w") as fh:
            json.dump({"heads": list(heads), "max_len": a.seq_len, "provenance": prov, "results": res}, fh, indent=1)
    log(f"done, {time.time() - T0:.0f}s")
    return 0


T0 = time.time()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--model-path", required=True, help="its tokenizer is used")
    c.add_argument("--out", required=True)
    c.add_argument("--seq-len", type=int, required=True)
    c.add_argument("--n-train", type=int, default=64)
    c.add_argument("--n-held", type=int, default=8)
    c.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--model-path", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--head", default="attn", choices=("attn", "single"))
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--seq-len", type=int, default=None, help="positions a sequence (default: the data's)")
    t.add_argument("--n-train", type=int, default=64, help="real windows used")
    t.add_argument("--n-gen", type=int, default=16, help="windows continued by the target itself")
    t.add_argument("--gen-len", type=int, default=1024)
    t.add_argument("--gen-batch", type=int, default=8)
    t.add_argument("--feat-batch", type=int, default=1)
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--max-seconds", type=float, default=180.0)
    t.add_argument("--seqs", type=int, default=2, help="whole sequences a step")
    t.add_argument("--picks", type=int, default=2048, help="loss entries a step (over the step's sequences)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--mlp-hidden", type=int, default=1024)
    t.add_argument("--heads", type=int, default=None, help="the attention head's query heads (default: target's)")
    t.add_argument("--kv-heads", type=int, default=None)
    t.add_argument("--head-dim", type=int, default=None)
    t.add_argument("--rope-theta", type=float, default=None, help="its RoPE base (default 1e6)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--compare", nargs="*", help="head directories to evaluate beside the new one")
    t.add_argument(
        "--init",
        default=None,
        help="a saved head's directory to go on training from (same kind and shape; its provenance is kept)",
    )
    t.add_argument(
        "--eval-gen",
        type=int,
        default=256,
        help="generated tokens a prefix in the evaluation; 0: teacher-forced only; -1: none",
    )
    t.add_argument("--eval-seqs", type=int, default=4)
    t.add_argument(
        "--val-windows",
        type=int,
        default=0,
        help="training windows after --n-train held back for validation; the weights of the best check are kept",
    )
    t.add_argument("--val-every", type=int, default=250, help="steps between validation checks")
    t.add_argument("--val-picks", type=int, default=4096, help="entries a validation check scores")
    a = ap.parse_args(argv)
    return cmd_corpus(a) if a.cmd == "corpus" else cmd_train(a)


if __name__ == "__main__":
    sys.exit(main())
