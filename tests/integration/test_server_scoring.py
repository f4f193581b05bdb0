"""Prompt scoring (`echo` + `logprobs`) scores the mode that is served (issue 41).

The tiny dummy model on the CPU, with K = 4 blocks of 16 tokens, so that sparsity binds past 80 tokens. In every
mode that selects (quest, retrieval, proxy, lookahead, hisparse), a greedy generation's log-probabilities must be
what scoring its own text gives (the prompt prefilled, `--score-prefill-tokens` = its length, the generated tokens
teacher-forced through the mode's decode), and differ from the dense reference's scores wherever the mode's greedy
tokens differ from dense's; `--score-attention dense` gives the dense reference in a sparse mode. Lookahead with
prompt lookup beside its head (`draft_ngram`, on the device in every step of a decode chain) likewise.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
import httpx
from exec_cases import cfg, prompts
from server_fakes import serve_app

from oasis_core.modes import REGISTRY
from oasis_exec.engine.engine import Engine
from oasis_exec.server.adapter import ExecutorEngine
from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig
from oasis_exec.server.tokenizer import ByteTokenizer

SELECTING = tuple(n for n, m in REGISTRY.items() if m.selects)
PROMPT = prompts(seed=3, lens=(150,))[0]  # ~9 blocks: K = 4 leaves most of the context out
GEN = 24


def _server(mode: str, engine: Engine | None = None, **server_kw):
    engine = ExecutorEngine(engine or Engine(cfg(mode, decode_chain=4)))
    return serve_app(create_app(engine, ByteTokenizer(), ServerConfig(port=0, **server_kw)))


def _complete(url: str, body: dict) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", **body}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def _ids(tokens: list[str]) -> list[int]:
    return [int(t[len("bytes:\\x") :], 16) if t.startswith("bytes:") else ord(t) for t in tokens]


def _generate(url: str) -> tuple[list[int], list[float]]:
    c = _complete(url, {"prompt": PROMPT, "max_tokens": GEN, "temperature": 0, "logprobs": 0})["choices"][0]
    return _ids(c["logprobs"]["tokens"]), c["logprobs"]["token_logprobs"]


def _score(url: str, ids: list[int], max_tokens: int = 0) -> list:
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0, "echo": True}
    lp = _complete(url, body)["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lp) == len(ids) + max_tokens and lp[0] is None
    return lp


@pytest.fixture(scope="module")
def dense_ref():
    """Dense's greedy tokens and its scores of a text."""
    with _server("dense") as url:
        toks, _ = _generate(url)
        yield toks, lambda ids: _score(url, ids)


@pytest.mark.parametrize("mode", SELECTING)
def test_scores_are_the_served_modes_decode(mode, dense_ref):
    dense_toks, dense_score = dense_ref
    with _server(mode, score_prefill_tokens=len(PROMPT)) as url:
        toks, gen_lp = _generate(url)
        text = PROMPT + toks
        scored = _score(url, text)[len(PROMPT) :]
        # what the mode computed while generating is what scoring the same text through it gives
        assert scored == pytest.approx(gen_lp, abs=2e-5)
    ref = dense_score(text)[len(PROMPT) :]
    first = next((i for i, (a, b) in enumerate(zip(toks, dense_toks)) if a != b), None)
    assert first is not None, f"{mode}: the greedy tokens equal dense's here: the test would prove nothing"
    assert max(abs(a - b) for a, b in zip(scored, ref)) > 1e-3  # the sparse decode's scores, not dense's


def test_scores_are_lookaheads_decode_with_prompt_lookup():
    """draft_ngram 2: generation (decode chains of 4) and scoring (one forced token a step) draft the same, so they
    compute the same; the lookup matched while generating, and changed what lookahead computes."""
    eng = Engine(cfg("lookahead", decode_chain=4, draft_ngram=2))
    with _server("lookahead", eng, score_prefill_tokens=len(PROMPT)) as url:
        toks, gen_lp = _generate(url)
        used = eng.runner.drafts.ngram.used
        scored = _score(url, PROMPT + toks)[len(PROMPT) :]
        assert scored == pytest.approx(gen_lp, abs=2e-5)
    with _server("lookahead") as url:
        plain = _score(url, PROMPT + toks)[len(PROMPT) :]
    assert used > 0 and max(abs(a - b) for a, b in zip(scored, plain)) > 1e-3


@pytest.mark.parametrize("mode", ("lookahead", "quest"))
def test_default_scores_every_token_by_decode_and_dense_switch(mode, dense_ref):
    _, dense_score = dense_ref
    text = PROMPT + list(range(60, 100))
    ref = dense_score(text)
    with _server(mode) as url:  # --score-prefill-tokens 1: every token after the first is a decode step's
        served = _score(url, text)
    with _server(mode, score_attention="dense") as url:
        dense_in_mode = _score(url, text)
    assert dense_in_mode[1:] == pytest.approx(ref[1:], abs=1e-5)  # the reference, whatever the mode
    n_fit = 4 * 16  # positions whose context fits the K resident blocks attend everything in every mode
    assert served[1:n_fit] == pytest.approx(ref[1:n_fit], abs=1e-4)
    assert max(abs(a - b) for a, b in zip(served[n_fit:], ref[n_fit:])) > 1e-3


def test_max_tokens_one_is_one_forward_and_matches_generation():
    """Dense, `echo` + `max_tokens` 1 (lm-eval's loglikelihood request): the prompt's scores and the one token come
    from one forward with no engine request; the token and its logprob are what generation gives."""
    with _server("dense") as url:
        c = _complete(url, {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True})
        plain = _complete(url, {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1})
    lp, plp = c["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(PROMPT) + 1
    assert lp["tokens"][-1] == plp["tokens"][0]
    assert lp["token_logprobs"][-1] == pytest.approx(plp["token_logprobs"][0], abs=1e-5)
    assert c["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 1, "total_tokens": len(PROMPT) + 1}


def test_speculative_sparse_server_refuses_served_scoring_and_serves_the_dense_switch():
    engine = ExecutorEngine(Engine(cfg("lookahead", speculative_k=2)))
    with serve_app(create_app(engine, ByteTokenizer(), ServerConfig(port=0))) as url:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 0, "logprobs": 0, "echo": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 400 and "--score-attention dense" in r.json()["error"]["message"], r.text
    engine = ExecutorEngine(Engine(cfg("lookahead", speculative_k=2)))
    with serve_app(create_app(engine, ByteTokenizer(), ServerConfig(port=0, score_attention="dense"))) as url:
        assert len(_score(url, PROMPT)) == len(PROMPT)


def test_streamed_and_batched_scores_are_the_same_in_a_sparse_mode():
    import json

    text = PROMPT[:40]
    with _server("lookahead") as url:
        body = {"prompt": text, "max_tokens": 3, "temperature": 0, "logprobs": 1, "echo": True}
        whole = _complete(url, body)["choices"][0]
        batch = _complete(url, {**body, "prompt": [text, PROMPT[:30]]})["choices"]
        got, chunks = [], []
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={"model": "tiny", **body, "stream": True}, timeout=600
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    c = json.loads(line[6:])["choices"][0]
                    chunks.append(c["text"])
                    got += c["logprobs"]["token_logprobs"] if c["logprobs"] else []
    assert len(whole["logprobs"]["token_logprobs"]) == len(text) + 3
    assert got == pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-6)
    assert "".join(chunks) == whole["text"] and chunks[0] == bytes(text).decode("utf-8", errors="replace")
    assert batch[0]["logprobs"]["token_logprobs"] == pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-6)
    assert len(batch[1]["logprobs"]["token_logprobs"]) == 33
