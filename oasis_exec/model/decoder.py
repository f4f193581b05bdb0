"""A Qwen3 / Llama-family decoder in plain torch: weights plus the per-layer pieces the runner composes.

The runner, not the model, owns attention: a layer is split into ``qkv`` (norm, projections, q/k norm, RoPE)
and ``finish`` (output projection, residual, MLP), so that each KV store plugs its own attention in between.
Weights are bf16 (float32 on request for CPU tests), random (``dummy``) or loaded from a Hugging Face directory
(``config.json`` + ``*.safetensors``) with the usual ``model.layers.{i}.self_attn.q_proj.weight`` names.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F

from oasis_core.echo import show
from oasis_core.specs import ModelSpec

from .files import ModelFileError, read_json_file


def rope_theta_of(cfg: dict) -> float:
    """RoPE base of a ``config.json``: top-level ``rope_theta`` or, as transformers 5 writes it, inside
    ``rope_parameters``; RoPE scaling (llama3, YaRN, linear, dynamic, ...) is refused, never ignored."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for d in (params, scaling):
        kind = d.get("rope_type", d.get("type", "default"))
        if kind not in ("default", None):
            raise ValueError(
                f"config.json: RoPE scaling {kind!r} is not implemented (only plain RoPE); refusing "
                "rather than running with wrong positions"
            )
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ValueError("config.json: no rope_theta (top level or in rope_parameters)")
    return float(theta)


def spec_from_hf_config(cfg: dict, name: str = "hf") -> ModelSpec:
    """The ``oasis_core`` spec of a Hugging Face Qwen3 / Llama ``config.json`` (a dense model), or a Gemma 3 one
    (``oasis_exec.model.gemma3``)."""
    if cfg.get("model_type") in ("gemma3_text", "gemma3"):
        from .gemma3_files import spec_from_hf_config as gemma3_spec

        return gemma3_spec(cfg, name)[0]
    n_q = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_q
    arch = " ".join(cfg.get("architectures", [])) + " " + cfg.get("model_type", "")
    return ModelSpec(
        name=name,
        n_layers=cfg["num_hidden_layers"],
        n_q_heads=n_q,
        n_kv_heads=cfg.get("num_key_value_heads", n_q),
        head_dim=head_dim,
        hidden=cfg["hidden_size"],
        mlp_hidden=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        max_context_tokens=cfg["max_position_embeddings"],
        qk_norm="qwen3" in arch.lower(),
        rope_theta=rope_theta_of(cfg),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )


def hf_shape_fields(spec: ModelSpec) -> dict:
    """The sizes every family's ``config.json`` names alike (layers, heads, widths, vocabulary, positions)."""
    return {
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_q_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.mlp_hidden,
        "vocab_size": spec.vocab,
        "max_position_embeddings": spec.max_context_tokens,
    }


def hf_config(spec: ModelSpec) -> dict:
    """The ``config.json`` of a dense ``spec`` (inverse of :func:`spec_from_hf_config`)."""
    return {
        "architectures": ["Qwen3ForCausalLM" if spec.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if spec.qk_norm else "llama",
        **hf_shape_fields(spec),
        "rope_theta": spec.rope_theta,
        "rms_norm_eps": spec.rms_eps,
        "tie_word_embeddings": spec.tie_embeddings,
    }


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, theta):
    """Rotate-half RoPE. x: [..., T, H, D]; pos: int64 [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [..., T, D/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]  # [..., T, 1, D/2]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _layer_names(i):
    p = f"model.layers.{i}."
    return {
        "q": p + "self_attn.q_proj.weight",
        "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight",
        "o": p + "self_attn.o_proj.weight",
        "q_norm": p + "self_attn.q_norm.weight",
        "k_norm": p + "self_attn.k_norm.weight",
        "ln1": p + "input_layernorm.weight",
        "ln2": p + "post_attention_layernorm.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
    }


def random_weights(shape: ModelSpec, seed: int = 0, dtype=torch.bfloat16, device="cpu") -> dict:
    """Random weights with the Hugging Face names; scaled so activations stay O(1) through many layers."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dev_gen = g if torch.device(device).type == "cpu" else torch.Generator(device=device).manual_seed(seed)
    h, d = shape.hidden, shape.head_dim

    def mat(rows, cols):
        return (torch.randn(rows, cols, generator=dev_gen, device=device, dtype=torch.float32) / math.sqrt(cols)).to(
            dtype
        )

    w = {
        "model.embed_tokens.weight": mat(shape.vocab, h) * math.sqrt(h) * 0.5,
        "model.norm.weight": torch.ones(h, dtype=dtype, device=device),
    }
    for i in range(shape.n_layers):
        n = _layer_names(i)
        w[n["q"]] = mat(shape.n_q_heads * d, h)
        w[n["k"]] = mat(shape.n_kv_heads * d, h)
        w[n["v"]] = mat(shape.n_kv_heads * d, h)
        w[n["o"]] = mat(h, shape.n_q_heads * d) * 0.5
        w[n["ln1"]] = torch.ones(h, dtype=dtype, device=device)
        w[n["ln2"]] = torch.ones(h, dtype=dtype, device=device)
        w[n["gate"]] = mat(shape.mlp_hidden, h)
        w[n["up"]] = mat(shape.mlp_hidden, h)
        w[n["down"]] = mat(h, shape.mlp_hidden) * 0.5
        if shape.qk_norm:
            w[n["q_norm"]] = torch.ones(d, dtype=dtype, device=device)
            w[n["k_norm"]] = torch.ones(d, dtype=dtype, device=device)
    if not shape.tie_embeddings:
        w["lm_head.weight"] = mat(shape.vocab, h)
    return w


def load_safetensors_dir(path: str, dtype, device) -> dict:
    from .files import load_safetensors_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    w = {}
    for f in files:
        for k, v in load_safetensors_file(os.path.join(path, f)).items():
            w[k] = v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
    return w


def save_checkpoint(path: str, shape: ModelSpec, weights: dict) -> None:
    """Write ``config.json`` + ``model.safetensors`` (used by tests to make a small checkpoint)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(hf_config(shape), fh, indent=1)
    save_file({k: v.contiguous().cpu() for k, v in weights.items()}, os.path.join(path, "model.safetensors"))


class Decoder:
    """Weights and the pieces of a decoder layer. Activations: x [N, hidden] for N tokens (flattened batch).

    ``fused=True`` runs the elementwise ops of ``qkv``, ``finish`` and ``logits`` as the Triton kernels of
    ``oasis_kernels.fused_ops`` (one launch each for RMSNorm, residual add + RMSNorm, q/k norm + RoPE + v copy, SwiGLU)
    on whatever device the weights are on: on CPU they run in Triton's interpreter, which is how the CPU tests check
    them against the plain path. The caller decides: the runner asks for them only on CUDA
    (``ExecConfig.fused_ops``). ``fused=False`` (default) is the plain torch code, the reference.
    """

    families: tuple = ("llama", "qwen3", "qwen2", "mistral")  # the architectures this class loads
    by_family: dict = {}  # architecture -> the subclass that loads it (registered as each is defined)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        Decoder.by_family.update(dict.fromkeys(cls.families, cls))

    def __init__(self, shape: ModelSpec, weights: dict, dtype=torch.bfloat16, fused: bool = False, tp=None):
        self.full_shape, self.tp = shape, tp  # tp: an oasis_exec.model.tensor_parallel.TPGroup, or None (one rank)
        if tp is not None:  # this rank's heads and MLP columns: ``shape`` is then the local one
            shape, weights = tp.shard(shape, weights)
        self.shape, self.dtype = shape, dtype
        self.fused = bool(fused)
        self.device = weights["model.embed_tokens.weight"].device
        self.embed = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"]
        self.lm_head = weights["model.embed_tokens.weight"] if shape.tie_embeddings else weights["lm_head.weight"]
        self.layers = []
        for i in range(shape.n_layers):
            n = _layer_names(i)
            missing = [v for k, v in n.items() if v not in weights and not (k.endswith("_norm") and not shape.qk_norm)]
            if missing:
                raise KeyError(f"checkpoint lacks {missing[0]} (and {len(missing) - 1} more)")
            lw = {k: weights.get(v) for k, v in n.items()}
            # Fused projections: one GEMM for q,k,v and one for gate,up.
            lw["qkv"] = torch.cat([lw.pop("q"), lw.pop("k"), lw.pop("v")], 0).contiguous()
            lw["gate_up"] = torch.cat([lw.pop("gate"), lw.pop("up")], 0).contiguous()
            self.layers.append(lw)
        self._fk = self._inv_freq = None
        if self.fused:
            from oasis_kernels import fused_ops  # imports kernels first: the interpreter switch precedes triton

            self._fk = fused_ops
            self._inv_freq = fused_ops.rope_inv_freq(shape.head_dim, shape.rope_theta, self.device)

    @staticmethod
    def build(
        shape: ModelSpec,
        path: str | None = None,
        seed: int = 0,
        dtype=torch.bfloat16,
        device="cpu",
        fused: bool = False,
        tp=None,
    ):
        """``tp``: this rank's ``TPGroup`` (the full model's weights are made or read, then sliced). Dummy weights
        (``path`` None) of a spec of another family (``ModelSpec.family``) build that family's decoder, so that a
        dummy run computes what the real model does."""
        if path is None:
            if shape.family != "llama":
                return Decoder.by_family[shape.family].dummy(shape, seed, dtype, device, fused, tp)
            return Decoder(shape, random_weights(shape, seed, dtype, device), dtype, fused, tp)
        return Decoder(shape, load_safetensors_dir(path, dtype, device), dtype, fused, tp)

    @staticmethod
    def from_dir(path: str, dtype=torch.bfloat16, device="cpu", fused: bool = False, tp=None) -> "Decoder":

        shape = read_hf_config(path)
        return Decoder.build(shape, path, dtype=dtype, device=device, fused=fused, tp=tp)

    @staticmethod
    def from_path(path: str, dtype=torch.bfloat16, device="cpu", fused: bool = False, tp=None) -> "Decoder":
        """A real model from a ``.gguf`` file or a Hugging Face directory: the class registered for its family
        (``Decoder.by_family``, filled by the subclasses' ``families``; ``family_of`` reads it from the file)."""
        cls = Decoder.by_family.get(family_of(path), Decoder)
        if cls is not Decoder:
            return cls.from_path(path, dtype, device, fused, tp)
        if str(path).endswith(".gguf"):
            from .gguf import load_gguf_weights, read_gguf

            g = read_gguf(path)
            return Decoder(g.spec, load_gguf_weights(g, dtype, device), dtype, fused, tp)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: neither a .gguf file nor a Hugging Face directory")
        return Decoder.from_dir(path, dtype, device, fused, tp)

    def embed_tokens(self, ids):
        """The input embeddings of token ids (a family may scale them: ``oasis_exec.model.gemma3``)."""
        return self.embed[ids]

    def forward(self, tokens, hook=None, cache=None, start=0, keep=None):
        """Plain causal forward of a batch of sequences (the reference path; no KV store): tokens [B, T] at positions
        start.. -> logits [B, T, V]; ``keep``: indices into the T positions whose logits are returned ([B, len(keep),
        V]; at long context the full [T, V] logits outweigh everything else), else all.

        ``hook(layer, q, k, v, x_out)`` is called per layer with q [B * T, Hq, D], k/v [B * T, Hkv, D] (RoPE applied)
        and the residual after the layer [B * T, hidden] (analysis and draft training read queries, keys and
        features). ``cache``: a list of per-layer (k, v) [B, S, Hkv, D] attended before these tokens, appended in
        place (an empty list starts one: batched greedy generation)."""
        tokens = torch.as_tensor(tokens, device=self.device)
        B, T = tokens.shape
        if cache and T > 1:  # SDPA's causal mask is aligned to the first key: right only without earlier keys
            raise ValueError("Decoder.forward: several tokens after a non-empty cache are not supported")
        pos = torch.arange(start, start + T, device=self.device).repeat(B)
        x = self.embed[tokens.reshape(-1)]
        g = self.shape.gqa_group
        for i in range(self.shape.n_layers):
            q, k, v = self.qkv(i, x, pos)
            qb, kb, vb = (t.view(B, T, t.shape[1], t.shape[2]) for t in (q, k, v))
            if cache is not None:
                kb, vb = extend_cache(cache, i, kb, vb)
            attn = F.scaled_dot_product_attention(
                qb.transpose(1, 2),
                kb.transpose(1, 2).repeat_interleave(g, 1),
                vb.transpose(1, 2).repeat_interleave(g, 1),
                is_causal=T > 1,
            )
            attn = attn.transpose(1, 2).reshape(B * T, q.shape[1], q.shape[2])
            x = self.finish(i, x, attn)
            if hook is not None:
                hook(i, q, k, v, x)
        x, T = keep_positions(x, B, T, keep)
        return self.logits(x).view(B, T, -1)

    def forward_dense(self, tokens, hook=None, keep=None):
        """``forward`` of one sequence: tokens [T] -> logits [T, V] (``keep``: [len(keep), V]); the hook's tensors
        are [T, ...]."""
        return self.forward(torch.as_tensor(tokens, device=self.device)[None], hook, keep=keep)[0]

    def qkv(self, i: int, x, pos):
        """x: [N, hidden], pos: [N] -> q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D] (RoPE applied)."""
        s, lw = self.shape, self.layers[i]
        hq, hk, d = s.n_q_heads, s.n_kv_heads, s.head_dim
        if self.fused:
            fk = self._fk
            y = fk.rms_norm(x, lw["ln1"], s.rms_eps) @ lw["qkv"].t()
            qw, kw = (lw["q_norm"], lw["k_norm"]) if s.qk_norm else (None, None)
            return fk.qk_norm_rope(y, pos, hq, hk, d, qw, kw, s.rms_eps, s.rope_theta, self._inv_freq)
        y = rms_norm(x, lw["ln1"], s.rms_eps) @ lw["qkv"].t()
        q = y[:, : hq * d].view(-1, hq, d)
        k = y[:, hq * d : (hq + hk) * d].view(-1, hk, d)
        v = y[:, (hq + hk) * d :].view(-1, hk, d)
        if s.qk_norm:
            q = rms_norm(q, lw["q_norm"], s.rms_eps)
            k = rms_norm(k, lw["k_norm"], s.rms_eps)
        return rope(q, pos, s.rope_theta), rope(k, pos, s.rope_theta), v.contiguous()

    def finish(self, i: int, x, attn):
        """x: residual [N, hidden], attn: [N, Hq, D] -> next residual [N, hidden]. Tensor parallel: ``attn`` holds
        this rank's query heads; the output projection and the MLP's down projection are each summed over the ranks
        (one all-reduce each; ``oasis_exec.model.tensor_parallel``)."""
        s, lw = self.shape, self.layers[i]
        red = self.tp.all_reduce if self.tp is not None else _same  # tensor parallel: sum the ranks' partial outputs
        o = red(attn.reshape(attn.shape[0], -1) @ lw["o"].t())
        if self.fused:
            fk = self._fk
            x, h = fk.add_rms_norm(x, o, lw["ln2"], s.rms_eps)
            return x + red(fk.silu_mul(h @ lw["gate_up"].t()) @ lw["down"].t())
        x = x + o
        gu = rms_norm(x, lw["ln2"], s.rms_eps) @ lw["gate_up"].t()
        g, u = gu.chunk(2, dim=-1)
        return x + red((F.silu(g) * u) @ lw["down"].t())

    def logits(self, x):
        norm = self._fk.rms_norm if self.fused else rms_norm
        return (norm(x, self.norm, self.shape.rms_eps) @ self.lm_head.t()).float()


def _same(x):
    return x


def keep_positions(x, batch: int, t: int, keep):
    """The rows of x [batch * t, hidden] at positions ``keep`` of each sequence (all when None) and their count."""
    if keep is None:
        return x, t
    x = x.view(batch, t, -1)[:, torch.as_tensor(keep, device=x.device)].reshape(-1, x.shape[-1])
    return x, x.shape[0] // batch


def attention_ref(q, k, v, mask=None):
    """Plain attention in float32. q: [B, Hq, Tq, D]; k, v: [B, Hkv, Tk, D]; mask: bool broadcastable to
    [B, Hkv, G, Tq, Tk] or [B, Hq, Tq, Tk] (True = attend). Returns [B, Hq, Tq, D] in q's dtype."""
    b, hq, tq, d = q.shape
    hk = k.shape[1]
    g = hq // hk
    qf = q.float().view(b, hk, g, tq, d)
    s = torch.einsum("bhgtd,bhsd->bhgts", qf, k.float()) / math.sqrt(d)
    if mask is not None:
        if mask.dim() == 4:
            mask = mask.view(b, hk, g, tq, -1) if mask.shape[1] == hq else mask[:, :, None]
        s = s.masked_fill(~mask, -math.inf)
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p)
    o = torch.einsum("bhgts,bhsd->bhgtd", p, v.float())
    return o.reshape(b, hq, tq, d).to(q.dtype)


def read_hf_config(model_dir: str):
    """The ``ModelSpec`` of the Hugging Face directory ``model_dir`` (its ``config.json``)."""
    path = os.path.join(model_dir, "config.json")
    cfg = read_json_file(path, "a Hugging Face model's config.json")
    try:
        return spec_from_hf_config(cfg, name=os.path.basename(os.path.normpath(model_dir)))
    except KeyError as e:
        raise ModelFileError(f"{path}: {e.args[0]}: missing required field") from None
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelFileError(f"{path}: a field has the wrong type or value: {show(str(e), 200)}") from None


def family_of(path: str) -> str | None:
    """The architecture named by a ``.gguf`` file or a Hugging Face directory (None when neither says)."""
    path = str(path)
    if path.endswith(".gguf"):
        from .gguf import read_gguf

        return str(read_gguf(path).meta.get("general.architecture"))
    cfg = os.path.join(path, "config.json")
    if os.path.isfile(cfg):
        with open(cfg) as fh:
            return json.load(fh).get("model_type")
    return None


def extend_cache(cache: list, i: int, k, v):
    """The reference forwards' per-layer cache: layer ``i``'s (k, v) [B, S, Hkv, D] with these positions appended
    (the entry created on the first call), returned for attention."""
    if len(cache) <= i:
        cache.append((k, v))
    else:
        cache[i] = (torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1))
    return cache[i]
