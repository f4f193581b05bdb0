"""What the CPU and the GPU real-model tests (SmolLM2-135M-Instruct against transformers) share: the sizes, the
prompts, transformers' greedy reference and where two outputs part."""

import torch

GREEDY = 64  # tokens of greedy output compared
SPARSE = ("quest", "proxy", "retrieval", "lookahead", "hisparse")
BLOCK, CONTEXT = 16, 128  # the longest prompt (38 tokens) + 64 fit in 8 blocks: top_k = 8 covers them all


def prompt_ids(tok) -> list:
    """The three prompts (token ids): a fact, code, and a chat through the model's template."""
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}], add_generation_prompt=True, tokenize=False
    )
    return [tok.encode(p) for p in ("The capital of France is", "def fibonacci(n):\n", chat)]


def shlex_ids(model_path, n) -> list:
    """The first ``n`` token ids of the standard library's ``shlex.py`` in the model's tokenizer: a long real text
    every machine has (the real-model tests that need more than the short prompts)."""
    import shlex

    from oasis_exec.server.tokenizer import load_tokenizer

    with open(shlex.__file__, encoding="utf-8") as fh:
        return load_tokenizer(model_path).encode(fh.read())[:n]


def hf_greedy(model, ids, n, eos=False):
    """transformers' greedy output (``n`` tokens, through EOS unless ``eos``), with the attention mask given."""
    x = torch.tensor([ids], device=model.device)
    kw = {} if eos else {"eos_token_id": None}
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, **kw)
    return out[0, len(ids) :].tolist()


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
