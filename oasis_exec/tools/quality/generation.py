"""The selection harness in generation (``quality selection --generate greedy|sample``; issue 37): the target
continues a real prompt by itself and the measured decode positions are its own tokens.

For a context of N tokens and P positions, the prompt is the text's first ``N - P - 1`` tokens and the target adds
``P + 1`` (``continue_ids``: greedy, or sampled at ``--temperature``, seeded; a plain KV cache). The measurement then
runs on prompt + continuation as ``selection.measure_tokens`` does on a text: the true next query ``q_{t+1}`` is the
query of the token the target produced, which is what the engine would score at step t + 1. In generation the
``oracle`` draft is that token (``oracle_next``), not the argmax at t (the two differ only when sampling).

``eagle3_attn``: the full EAGLE-3 layer (``oasis_exec.model.draft_attn``) over every earlier position; its draft for t + 1
is the causal forward over entries 0 .. t - 1 (features at p, token p + 1) of the dense trace, which equals the
engine's incremental decode (``tests/unit/test_draft_attn.py``).
"""

from __future__ import annotations

import torch

GENERATE = ("none", "greedy", "sample")


def npz_ids(spec: str, n_tokens: int, option: str = "--token-texts") -> tuple[str, list[int]]:
    """``--token-texts`` entry ``FILE.npz:KEY`` or ``FILE.npz:KEY:ROW`` -> (name, its first ``n_tokens`` ids): token ids
    made elsewhere (e.g. ``experiments/long_context_draft/data/*.npz``: ``text:licences``, ``held`` rows), so that
    no tokenizer runs here (transformers 5.17 converts Gemma's GGUF tokenizer wrongly). ``option``: the option the
    errors name."""
    import os

    import numpy as np

    path, sep, rest = spec.partition(".npz:")
    if not sep:
        raise ValueError(f"{option} {spec!r}: want FILE.npz:KEY or FILE.npz:KEY:ROW")
    path += ".npz"
    if not os.path.isfile(path):
        raise ValueError(f"{option} {spec!r}: no such file {path}")
    key, row = rest, None
    with np.load(path) as z:
        if key not in z.files and ":" in rest:
            key, row = rest.rsplit(":", 1)
        if key not in z.files or (row is not None and not row.isdigit()):
            raise ValueError(f"{option} {spec!r}: no key {rest!r} in {path} (keys: {', '.join(z.files)})")
        a = z[key] if row is None else z[key][int(row)]
    if a.ndim != 1:
        raise ValueError(f"{option} {spec!r}: {key!r} is {a.ndim}-D; name a row (FILE.npz:{key}:ROW)")
    name = os.path.basename(path)[:-4] + ":" + key + ("" if row is None else ":" + row)
    return name, [int(t) for t in a[:n_tokens]]


@torch.no_grad()
def continue_ids(dec, prompt, n_new: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """prompt ids + the target's own ``n_new`` tokens (greedy when ``temperature`` is 0)."""
    g = torch.Generator(device=dec.device).manual_seed(seed)
    seq = torch.as_tensor(prompt, device=dec.device)[None]
    cache = []
    logits = dec.forward(seq, cache=cache, keep=[seq.shape[1] - 1])[:, -1]  # the last row: [T, V] is 17 GB at 16K
    out = []
    for j in range(n_new):
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=g)[:, 0]
        else:
            nxt = logits.argmax(-1)
        out.append(int(nxt))
        if j < n_new - 1:
            logits = dec.forward(nxt[:, None], cache=cache, start=seq.shape[1] + j)[:, -1]
    return [int(t) for t in prompt] + out


@torch.no_grad()
def attn_draft_tokens(head, dec, aux_all, tokens, ts, with_prob: bool = False, top: int = 2):
    """Draft ids [P, 2] (the best and the second-best token) of the attention head for positions ``ts`` [P]
    (``d_{t+1}``, from entry t - 1: features at t - 1 and token t). aux_all: [N, 3 * hidden] features at every
    position; tokens: [N]. ``top``: how many of the head's best tokens, best first (ids [P, top]). ``with_prob``: also
    their probabilities [P, top] (float32, CPU), the first as the engine's draft gate reads it (``exp(logit -
    logsumexp)`` over the head's vocabulary)."""
    from oasis_exec.model.draft_attn import hidden_seq

    tokens = torch.as_tensor(tokens, device=aux_all.device)
    last = int(ts.max())  # entries 0 .. last - 1
    dt = head.w["fc.weight"].dtype
    aux = aux_all[:last].to(dt)[None]
    emb = dec.embed[tokens[1 : last + 1]].to(dt)[None]
    h = hidden_seq(head.w, head.attn, dec.shape.rms_eps, aux, emb)[0]
    got = head.top_ids(h[ts.to(h.device) - 1], top, with_prob)
    if not with_prob:
        return got.long().cpu()
    return got[0].long().cpu(), got[1].float().cpu()


def build_attn_head(args, dec):
    """The ``eagle3_attn`` draft's head (``--draft-attn-path``, or random weights) and its description."""
    import os

    from oasis_exec.model.draft_attn import AttnDraftHead

    from ...model.gguf import sha256_file

    dtype = getattr(torch, args.dtype)
    path = getattr(args, "draft_attn_path", None)
    head = AttnDraftHead.build(dec.shape, dec.embed, path, dtype=dtype, device=args.device, lm_head=dec.lm_head)
    info = {"path": path, "weights": "trained" if path else "random (seed 1)", "kind": "attn"}
    if path and os.path.isfile(os.path.join(path, "model.safetensors")):
        info["sha256"] = sha256_file(os.path.join(path, "model.safetensors"))
    return head, info
