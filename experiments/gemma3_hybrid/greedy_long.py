"""Gemma 3 270M on the GPU (bf16): the engine's greedy output against transformers' at long contexts (issue 36).

For each context length (default 16K and 32K tokens of a real text: the Python standard library's sources joined, a
text every machine has) and each mode: our engine's 64 greedy tokens (``dense``: rings for the 15 sliding layers,
pages for the 3 full ones; CUDA graphs on) against transformers' greedy tokens on the same ids (sdpa, bf16, the
model read from the same GGUF). The ids come from our tokenizer built from the GGUF metadata: transformers 5.17
converts this GGUF's tokenizer wrongly (/work/shared/models/README.md). Tie rule as the SmolLM2 GPU test
(tests/gpu/test_real_model_gpu.py): identical, or parted where our token lies at most ``TIE_STEPS`` bf16 steps below
transformers' greedy logit (teacher forcing on our own output). Writes one JSON line per (length, mode) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import oasis_kernels  # noqa: E402,F401  -- before transformers imports triton
from oasis_exec.config import ExecConfig  # noqa: E402
from oasis_exec.engine.engine import Engine  # noqa: E402
from oasis_exec.engine.scheduler import SamplingParams  # noqa: E402
from oasis_exec.server.tokenizer import load_tokenizer  # noqa: E402

TIE_STEPS = 2
STDLIB = ("argparse", "typing", "dataclasses", "inspect", "pathlib", "subprocess", "tarfile", "zipfile", "pydoc")


def text_ids(tok, n):
    import importlib

    parts = []
    for name in STDLIB:
        with open(importlib.import_module(name).__file__, encoding="utf-8") as fh:
            parts.append(fh.read())
    ids = tok.encode("\n\n".join(parts))
    if len(ids) < n:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def steps_below_max(model, ids, out):
    x = torch.tensor([ids + out], device=model.device)
    with torch.no_grad():
        logits = model(x, logits_to_keep=len(out) + 1).logits[0, :-1].float()
    top = logits.max(-1).values  # steps of bf16 (the GPU's dtype; a CPU run in fp32 is held to the same rule)
    step = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(top.abs())))
    chosen = logits.gather(1, torch.tensor(out, device=model.device)[:, None])[:, 0]
    return ((top - chosen) / step).cpu()


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--lengths", default="16384,32704")  # 32K: room for 64 tokens in the 32,768 positions
    ap.add_argument("--modes", default="dense")
    ap.add_argument("--greedy", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cuda (bf16: the figures) or cpu (fp32: a smoke run)")
    a = ap.parse_args()
    import transformers

    from oasis_exec.model.decoder import Decoder

    dev = a.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    tok = load_tokenizer(a.gguf)
    d, name = os.path.split(a.gguf)
    t0 = time.time()
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=dtype, attn_implementation="sdpa")
    hf = hf.to(dev).eval()
    print(f"transformers {transformers.__version__} loaded in {time.time() - t0:.0f}s", flush=True)
    dec = Decoder.from_path(a.gguf, dtype, dev)
    positions = dec.shape.max_context_tokens  # 32,768: the engine refuses a max_context past them
    for n in (int(x) for x in a.lengths.split(",")):
        ids = text_ids(tok, n)
        ctx = min(n + a.greedy + 16, positions)
        if n + a.greedy > ctx:
            raise SystemExit(f"--lengths {n} + --greedy {a.greedy} exceed the model's {positions} positions")
        x = torch.tensor([ids], device=dev)
        with torch.no_grad():
            ref = hf.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=a.greedy, do_sample=False, eos_token_id=None
            )[0, n:].tolist()
        for mode in a.modes.split(","):
            cfg = ExecConfig(
                model_path=a.gguf,
                device=dev,
                dtype="bfloat16" if dev == "cuda" else "float32",
                mode=mode,
                max_context=ctx,
                max_lanes=1,
                block_size=16,
                # a sparse mode with K covering every block: the full layers' selection, host copies and transfers
                # run, and the output must be dense's
                **({} if mode == "dense" else {"top_k": -(-ctx // 16), "fetch_ratio": 1.0}),
            )
            from oasis_exec.runner.runner import Runner

            t1 = time.time()
            eng = Engine(cfg, Runner(cfg, decoder=dec))
            got = eng.generate([ids], SamplingParams(max_tokens=a.greedy))[0]
            eng.close()
            steps = steps_below_max(hf, ids, got)
            div = first_divergence(got, ref)
            ok = div is None or float(steps.max()) <= TIE_STEPS
            row = dict(
                n=n,
                mode=mode,
                greedy=a.greedy,
                identical_for=len(got) if div is None else div,
                pass_tie_rule=ok,
                max_bf16_steps_below=float(steps.max()),
                tokens_above_0=int((steps > 0).sum()),
                engine_s=round(time.time() - t1, 1),
                ours=got,
                ref=ref,
                commit=os.environ.get("OASIS_COMMIT"),
                weights="real (gemma-3-270m-q4_k_m.gguf)",
                torch=torch.__version__,
                transformers=transformers.__version__,
                gpu=torch.cuda.get_device_name() if dev == "cuda" else "none (cpu, fp32)",
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            )
            print({k: v for k, v in row.items() if k not in ("ours", "ref")}, flush=True)
            with open(a.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
