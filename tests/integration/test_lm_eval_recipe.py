"""docs/eval_harness.md's recipe, short: EleutherAI's lm-eval (`--model local-completions`, the `eval` extra) against
`python -m oasis_exec serve` with the real SmolLM2-135M on the CPU, no local tokenizer (the server's /tokenize),
`--batch_size 4`, on the three small local tasks of docs/examples/lm_eval (loglikelihood, rolling perplexity,
generate_until). In `dense` every figure lm-eval reads must be transformers' on the same GGUF: each choice's
log-likelihood and each text's rolling log-likelihood (1e-3 nats), each generation's text."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")
import torch
from server_proc import ROOT, ServerProcess

from oasis_exec.model.gguf import smollm2_path

TASKS = ("oasis_mc", "oasis_rolling", "oasis_gen")
MAX_LENGTH = 512


@pytest.fixture(scope="module")
def gguf():
    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def hf(gguf):
    d, name = os.path.split(gguf)
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="module")
def samples(gguf, tmp_path_factory):
    """Run the recipe; its per-task samples (lm-eval's --log_samples) and results."""
    out = tmp_path_factory.mktemp("lm_eval")
    srv = ServerProcess(
        *("--model", gguf, "--device", "cpu", "--dtype", "float32", "--mode", "dense"),
        *("--max-context", str(MAX_LENGTH), "--max-lanes", "4", "--served-model-name", "smollm2"),
        start_timeout_s=180,
    )
    try:
        args = (
            f"model=smollm2,base_url={srv.base_url}/v1/completions,num_concurrent=1,max_retries=1,"
            f"tokenized_requests=True,max_length={MAX_LENGTH}"
        )
        cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args]
        cmd += ["--tasks", ",".join(TASKS), "--include_path", "docs/examples/lm_eval", "--batch_size", "4"]
        cmd += ["--output_path", str(out), "--log_samples"]
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "Using remote tokenizer backend" in run.stderr + run.stdout  # no local tokenizer
        assert "batch_size: 4" in run.stdout
    finally:
        srv.stop()
    got = {}
    for task in TASKS:
        (path,) = glob.glob(str(out / "*" / f"samples_{task}_*.jsonl"))
        with open(path) as fh:
            got[task] = [json.loads(line) for line in fh]
    (res,) = glob.glob(str(out / "*" / "results_*.json"))
    with open(res) as fh:
        got["results"] = json.load(fh)["results"]
    return got


def _loglik(model, ids: list[int], n_scored: int) -> float:
    """transformers: sum of log p(token) over the last `n_scored` of `ids`."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(lp[i - 1, ids[i]].item() for i in range(len(ids) - n_scored, len(ids)))


@pytest.mark.slow
def test_loglikelihood_requests_equal_transformers(samples, hf):
    model, tok = hf
    assert set(samples["results"]) == set(TASKS)
    for s in samples["oasis_mc"]:
        for i, (ll, _greedy) in enumerate(s["filtered_resps"]):
            ctx, cont = s["arguments"][f"gen_args_{i}"]["arg_0"], s["arguments"][f"gen_args_{i}"]["arg_1"]
            whole, head = tok.encode(ctx + cont), tok.encode(ctx)  # lm-eval's split of a (context, continuation)
            assert float(ll) == pytest.approx(_loglik(model, whole, len(whole) - len(head)), abs=1e-3)


@pytest.mark.slow
def test_rolling_perplexity_equals_transformers(samples, hf):
    model, tok = hf
    # lm-eval's prefix token (api_models.prefix_token_id, remote tokenizer): the BOS /tokenizer_info names, else EOS
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    for s in samples["oasis_rolling"]:
        ids = tok.encode(s["doc"]["text"])
        assert len(ids) < MAX_LENGTH  # one window
        assert float(s["filtered_resps"][0]) == pytest.approx(_loglik(model, [prefix, *ids], len(ids)), abs=1e-3)


@pytest.mark.slow
def test_generations_equal_transformers(samples, hf):
    model, tok = hf
    for s in samples["oasis_gen"]:
        ids = tok.encode(s["doc"]["question"])
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)), max_new_tokens=12, do_sample=False
            )
        text = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
        for stop in ("\n", "Question:"):
            text = text.split(stop)[0]
        assert s["filtered_resps"][0] == text
