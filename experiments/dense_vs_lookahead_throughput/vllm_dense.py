"""vLLM dense decode throughput at fixed concurrency and context, on the GPU machine only (vllm_setup.sh).

    python vllm_dense.py --ctx 16384 --conc 21,16 --kv-bytes 52e9 --out vllm_16k.json                 # dummy Qwen3-8B
    python vllm_dense.py --ctx 16384 --conc 42 --kv-bytes 52e9 --kv-cache-dtype fp8 --out vllm_16k_fp8.json
    python vllm_dense.py --gguf model.gguf --ctx 8096 --decode 64 --conc 32 --out vllm_real_8k.json   # real weights

Each run adds ``conc`` requests of ``ctx`` random prompt tokens, decodes ``decode`` tokens each (ignore_eos, greedy)
and reports decode-only throughput: output tokens from the step at which every request has its first token to the
end, over that time (the prefill is excluded as in the OasisKV bench, which starts its clock after prefill).
``--gguf``: the real model's GGUF, converted once to a Hugging Face directory by transformers (real weights);
otherwise the Qwen3-8B shape with ``load_format=dummy`` (random weights). The record names its weights.
"""

import argparse
import json
import os
import random
import time

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "vocab_size": 151936,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "use_sliding_window": False, "max_window_layers": 36,
}  # fmt: skip


def model_dir(a) -> tuple:
    """(directory, load_format, weights, vocab) of the model vLLM loads."""
    if not a.gguf:
        d = "/tmp/vllm-qwen3-8b"
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(QWEN3_8B, f)
        return d, "dummy", "dummy", QWEN3_8B["vocab_size"]
    d = "/tmp/vllm-" + os.path.splitext(os.path.basename(a.gguf))[0]
    if not os.path.exists(os.path.join(d, "config.json")):
        hf_dir_from_gguf(a.gguf, d)
    with open(os.path.join(d, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return d, "auto", "real", vocab


def hf_dir_from_gguf(gguf: str, d: str) -> None:
    """A Hugging Face directory (config.json + model.safetensors, bf16) of the GGUF's weights as transformers
    dequantizes them. ``save_pretrained`` refuses a model loaded from a GGUF ("not serializable"), so the state dict
    is written directly: the GGUF quantization entry dropped from the config, a tied lm_head left to the config."""
    import torch
    import transformers
    from safetensors.torch import save_file

    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf), dtype=torch.bfloat16
    )
    cfg = m.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = cfg.get("architectures") or [type(m).__name__]  # vLLM picks its model class by it
    sd = m.state_dict()
    if cfg.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    os.makedirs(d, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"), {"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--conc", default="16")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--kv-bytes", type=float, default=0, help="KV cache bytes (0 = what vLLM sizes)")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto (bf16) | fp8 (e4m3)")
    ap.add_argument("--attention-backend", default="FLASH_ATTN")
    ap.add_argument("--gguf", default="", help="real weights: the model's GGUF")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    concs = [int(c) for c in a.conc.split(",")]
    d, load_format, weights, vocab = model_dir(a)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(
        model=d, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
        max_model_len=a.ctx + a.decode + 16, enable_prefix_caching=False, max_num_seqs=max(concs),
        gpu_memory_utilization=0.92, seed=0, kv_cache_dtype=a.kv_cache_dtype, attention_backend=a.attention_backend,
    )  # fmt: skip
    if a.kv_bytes:
        kw["kv_cache_memory_bytes"] = int(a.kv_bytes)
    t0 = time.time()
    llm = LLM(**kw)
    eng = llm.llm_engine
    res = {
        "tool": "vllm_dense", "vllm": __import__("vllm").__version__, "weights": weights, "model_dir": d,
        "ctx": a.ctx, "decode": a.decode, "kv_bytes": a.kv_bytes, "kv_cache_dtype": a.kv_cache_dtype,
        "attention_backend": a.attention_backend, "init_s": round(time.time() - t0, 1), "runs": [],
        "commit": os.environ.get("OASIS_COMMIT"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    try:
        res["num_gpu_blocks"] = eng.vllm_config.cache_config.num_gpu_blocks
    except Exception as e:  # noqa: BLE001 - the field moved between versions; the record says so
        res["num_gpu_blocks"] = repr(e)[:100]
    print("init", res, flush=True)
    rng, rid = random.Random(0), 0
    for C in concs:
        sp = SamplingParams(max_tokens=a.decode + 1, ignore_eos=True, temperature=0.0, detokenize=False)
        for _ in range(C):
            ids = [rng.randrange(100, vocab - 100) for _ in range(a.ctx)]
            eng.add_request(str(rid), TokensPrompt(prompt_token_ids=ids), sp)
            rid += 1
        ntok, t_start, t_dec0, tok0 = {}, time.time(), None, 0
        while eng.has_unfinished_requests():
            outs = eng.step()
            now = time.time()
            for o in outs:
                ntok[o.request_id] = len(o.outputs[0].token_ids)
            if t_dec0 is None and len(ntok) == C and all(v >= 1 for v in ntok.values()):
                t_dec0, tok0 = now, sum(ntok.values())
        dec_tok, dec_s = sum(ntok.values()) - tok0, time.time() - t_dec0
        run = {
            "conc": C, "prefill_s": round(t_dec0 - t_start, 2), "decode_tokens": dec_tok, "decode_s": round(dec_s, 3),
            "decode_tok_s": round(dec_tok / dec_s, 1), "tpot_ms": round(1000 * dec_s / max(1, dec_tok / C), 2),
        }  # fmt: skip
        print(run, flush=True)
        res["runs"].append(run)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
