#!/usr/bin/python3
"""Independent reader/writer of Hugging Face checkpoints, used by hf_test.cc.

Written from Hugging Face's published conventions for LlamaForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, MixtralForCausalLM,
Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, Dots1ForCausalLM,
Phi3ForCausalLM (with partial_rotary_factor: the first int(head_dim x
factor) values of a head rotate, the rest pass), GLM-4.5's
Glm4MoeForCausalLM (glm4_moe_reference.py) and
GPT2LMHeadModel (config.json keys, Mixtral's sparse MoE block: softmax router, top-k
renormalised, SwiGLU experts w2(silu(w1 x) * w3 x); the Qwen MoE blocks:
the same with top-k renormalised only when norm_topk_prob, and Qwen2-MoE's
shared expert scaled by sigmoid(shared_expert_gate x) and its dense layers
(mlp_only_layers, decoder_sparse_step); dots.llm1's DeepSeek-V3 block:
sigmoid scores, group-limited top-k on the scores plus
e_score_correction_bias, routed_scaling_factor, an ungated shared expert,
first_k_dense_replace dense layers; Qwen3's RMSNorm of
each head of q and k before RoPE and head_dim apart from hidden / heads; and its
load_balancing_loss_func over all layers' router logits, parameter names,
GPT-2's Conv1D weights stored [in, out], rotate-half RoPE, RoPE scaling as
transformers' modeling_rope_utils defines the linear, llama3, yarn and
longrope types (longrope's factor list chosen by the sequence's length),
Qwen2's q/k/v biases, grouped-query attention by repeating each key/value
head, tied input/output embeddings, sharded safetensors with
model.safetensors.index.json), not from Nekton's code. There is no
`transformers` or `safetensors` package here: safetensors files are read and
written with struct + numpy, and the models are a few lines of torch.

  hf_reference.py write HF_DIR SPEC.json REF.safetensors
      writes a random model in HF layout as SPEC.json asks, and its logits on a
      random batch plus a greedy continuation into REF.safetensors
  hf_reference.py logprobs HF_DIR IDS.json K
      prints each token's log-probability after the ones before it, and the K
      most likely ids at each position, as JSON
  hf_reference.py grads HF_DIR BATCH.safetensors OUT.safetensors AUX Z
      the training loss mean cross-entropy(tokens -> targets) + AUX x the
      load-balancing loss + Z x the router z-loss of BATCH's tokens and
      targets, and its gradient for every weight (autograd, float64), into
      OUT ("loss" and the weights' names)
  hf_reference.py check HF_DIR NEKTON.safetensors TOL
      recomputes the logits (and greedy continuation) of the tokens in
      NEKTON.safetensors from the HF folder; exits 1 if they differ by more
      than TOL (max |ours - ref| / max |ref|) or the continuation differs
"""
import json
import re
import math
import os
import sys

import numpy as np
import torch

# ---- safetensors ----

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import read_safetensors, write_safetensors  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma_reference  # noqa: E402  Gemma2ForCausalLM, Gemma3ForCausalLM
import deepseek_reference  # noqa: E402  DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
import glm4_moe_reference  # noqa: E402  Glm4MoeForCausalLM



def read_hf_weights(d):
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(read_safetensors(os.path.join(d, file)))
    for name, file in index["weight_map"].items():
        assert name in out, f"index names {name} in {file}, which lacks it"
    return out


# ---- the models, as transformers defines them ----


def causal_attention(q, k, v, window=None):
    # q, k, v: [B, H, T, D]; window: Mistral's sliding_window (query t sees
    # keys s with t - window < s <= t), None for full causal attention
    T, D = q.shape[2], q.shape[3]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if window:
        mask = mask & ~torch.ones(T, T, dtype=torch.bool).tril(-window)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rope_frequencies(cfg, D, T=None):
    """(inverse frequencies [D/2], cos/sin scale) as transformers' RoPE init
    functions define them for the config's rope_scaling (float64 here), for a
    sequence of T positions (longrope's choice of factors)."""
    theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    if kind == "default":
        return inv, 1.0
    if kind in ("longrope", "su"):
        # Phi-3's config has a top-level original context; the factor is then
        # max_position_embeddings over it. The long factors apply to a
        # sequence longer than the original context (dynamic in transformers).
        if "original_max_position_embeddings" in cfg:
            old = cfg["original_max_position_embeddings"]
            factor = cfg["max_position_embeddings"] / old
        else:
            old = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
            factor = rs.get("factor", 1.0)
        ext = rs["long_factor"] if T is not None and T > old else rs["short_factor"]
        inv = inv / torch.tensor(ext, dtype=torch.float64)
        scale = rs.get("attention_factor")
        if scale is None:
            scale = math.sqrt(1 + math.log(factor) / math.log(old)) if factor > 1 else 1.0
        return inv, scale
    factor = rs["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        old = rs["original_max_position_embeddings"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = (1 - smooth) * inv / factor + smooth * inv
        out = torch.where(wavelen > old / lo, inv / factor, medium)
        return torch.where(wavelen < old / hi, inv, out), 1.0
    if kind == "yarn":
        old = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def pair_turning(rotations):  # the pair index that turns so often over `old`
            return D * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = pair_turning(beta_fast), pair_turning(beta_slow)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, D - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(D // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        extrapolate = 1 - ramp
        inv = inv / factor * (1 - extrapolate) + inv * extrapolate
        scale = rs.get("attention_factor")
        if scale is None:
            scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return inv, scale
    raise ValueError(f"rope type {kind}")


def mixtral_moe(cfg, W, p, h, routers):
    """Mixtral's sparse MoE block on h [B, T, C], computed densely: every
    expert on every token, weighted by the renormalised top-k softmax scores
    (0 for the experts a token did not choose). The router logits are
    appended to `routers`."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    logits = h @ W[p + "block_sparse_moe.gate.weight"].T
    routers.append(logits.reshape(-1, E))
    probs = torch.softmax(logits, dim=-1)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        x = f"{p}block_sparse_moe.experts.{e}."
        weight = (top_w * (top_i == e)).sum(dim=-1, keepdim=True)
        y = torch.nn.functional.silu(h @ W[x + "w1.weight"].T) * (h @ W[x + "w3.weight"].T)
        out = out + weight * (y @ W[x + "w2.weight"].T)
    return out


def qwen_sparse_layer(cfg, l):
    """Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer l has the sparse
    block unless it is in mlp_only_layers or (l + 1) is not a multiple of
    decoder_sparse_step (then a dense MLP of intermediate_size)."""
    step = cfg.get("decoder_sparse_step", 1)
    return l not in cfg.get("mlp_only_layers", []) and cfg["num_experts"] > 0 and (l + 1) % step == 0


def qwen_moe(cfg, W, p, h, routers):
    """Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock on h [B, T, C],
    densely: softmax router, top-k (renormalised when norm_topk_prob), every
    expert on every token weighted by its score or 0; plus, when the
    checkpoint has one, the shared expert times sigmoid(shared_expert_gate h)."""
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    m = p + "mlp."
    logits = h @ W[m + "gate.weight"].T
    routers.append(logits.reshape(-1, E))
    probs = torch.softmax(logits, dim=-1)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    if cfg.get("norm_topk_prob", False):
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)

    def mlp(x, pre):
        g = torch.nn.functional.silu(x @ W[pre + "gate_proj.weight"].T)
        return (g * (x @ W[pre + "up_proj.weight"].T)) @ W[pre + "down_proj.weight"].T

    out = torch.zeros_like(h)
    for e in range(E):
        weight = (top_w * (top_i == e)).sum(dim=-1, keepdim=True)
        out = out + weight * mlp(h, f"{m}experts.{e}.")
    if m + "shared_expert.gate_proj.weight" in W:
        gate = torch.sigmoid(h @ W[m + "shared_expert_gate.weight"].T)
        out = out + gate * mlp(h, m + "shared_expert.")
    return out


def dots1_moe(cfg, W, p, h):
    """Dots1MoE (DeepSeek-V3's block) on h [B, T, C], densely: scores
    sigmoid(router h); choice = scores + e_score_correction_bias; each group
    of E / n_group experts scored by the sum of its two best choices, the
    topk_group best groups kept (the others' choices set to 0), the top k
    choices taken; their unbiased scores, divided by their sum (+ 1e-20) when
    norm_topk_prob, times routed_scaling_factor, weight the experts; plus the
    shared experts' MLP of n_shared_experts x moe_intermediate_size."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, TG = cfg["n_group"], cfg["topk_group"]
    m = p + "mlp."
    x = h.reshape(-1, h.shape[-1])
    scores = torch.sigmoid(x @ W[m + "gate.weight"].T)
    choice = scores + W[m + "gate.e_score_correction_bias"][None]
    group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = group_scores.topk(TG, dim=-1)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    keep = group_mask[:, :, None].expand(-1, G, E // G).reshape(-1, E)
    top_i = choice.masked_fill(keep == 0, 0.0).topk(k, dim=-1)[1]
    top_w = scores.gather(1, top_i)
    if cfg.get("norm_topk_prob", False):
        top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
    top_w = top_w * cfg.get("routed_scaling_factor", 1.0)

    def mlp(y, pre):
        g = torch.nn.functional.silu(y @ W[pre + "gate_proj.weight"].T)
        return (g * (y @ W[pre + "up_proj.weight"].T)) @ W[pre + "down_proj.weight"].T

    out = torch.zeros_like(x)
    for e in range(E):
        weight = (top_w * (top_i == e)).sum(dim=-1, keepdim=True)
        out = out + weight * mlp(x, f"{m}experts.{e}.")
    out = out + mlp(x, m + "shared_experts.")
    return out.view(h.shape)


def load_balancing_loss(cfg, routers):
    """transformers' load_balancing_loss_func: E sum_e f_e P_e over every
    layer's tokens together (f_e: the fraction of top-k choices that are e,
    not differentiated; P_e: mean softmax score of e)."""
    E = cfg.get("num_local_experts") or cfg["num_experts"]
    k = cfg["num_experts_per_tok"]
    logits = torch.cat(routers, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, chosen = torch.topk(probs, k, dim=-1)
    mask = torch.nn.functional.one_hot(chosen, E).to(probs.dtype)  # [N, k, E]
    tokens_per_expert = mask.mean(dim=0)
    prob_per_expert = probs.mean(dim=0)
    return (tokens_per_expert * prob_per_expert[None]).sum() * E


def router_z_loss(routers):
    logits = torch.cat(routers, dim=0)
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def llama_logits(cfg, W, tokens, qkv_bias=False, routers=None):
    B, T = tokens.shape
    arch = cfg["architectures"][0]
    mixtral = arch == "MixtralForCausalLM"
    mistral = arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
    qwen_moe_block = arch in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
    qk_norm = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Dots1ForCausalLM")
    dots1 = arch == "Dots1ForCausalLM"
    routers = [] if routers is None else routers
    C = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    eps = cfg.get("rms_norm_eps", 1e-6)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    # partial_rotary_factor (Phi-4-mini): the first R values of each head
    # rotate (rotate_half over R), the rest pass through.
    R = int(D * cfg.get("partial_rotary_factor", 1.0))

    def rotate_half(x):
        return torch.cat((-x[..., R // 2 :], x[..., : R // 2]), dim=-1)

    def rope(x):
        return torch.cat((x[..., :R] * cos + rotate_half(x[..., :R]) * sin, x[..., R:]), dim=-1)

    def proj(h, name):  # Qwen2: q, k, v carry biases
        y = h @ W[name + ".weight"].T
        return y + W[name + ".bias"] if qkv_bias else y

    if arch == "Phi3ForCausalLM":  # fused projections, sliced as Phi3Attention and Phi3MLP do
        W = dict(W)
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            qkv = W[p + "self_attn.qkv_proj.weight"]
            W[p + "self_attn.q_proj.weight"] = qkv[: H * D]
            W[p + "self_attn.k_proj.weight"] = qkv[H * D : H * D + KV * D]
            W[p + "self_attn.v_proj.weight"] = qkv[H * D + KV * D :]
            gate, up = W[p + "mlp.gate_up_proj.weight"].chunk(2, dim=0)
            W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"] = gate, up

    inv_freq, scale = rope_frequencies(cfg, R, T)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale

    x = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = proj(h, p + "self_attn.q_proj").view(B, T, H, D)
        k = proj(h, p + "self_attn.k_proj").view(B, T, KV, D)
        if qk_norm:  # Qwen3: RMSNorm over each head's D values
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = proj(h, p + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        q, k = rope(q), rope(k)
        rep = H // KV  # repeat_kv: query head i reads key/value head i // rep
        k = k[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        v = v[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        a = causal_attention(q, k, v, cfg.get("sliding_window") if mistral else None)
        a = a.transpose(1, 2).reshape(B, T, H * D)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        if mixtral:
            x = x + mixtral_moe(cfg, W, p, h, routers)
            continue
        if qwen_moe_block and qwen_sparse_layer(cfg, l):
            x = x + qwen_moe(cfg, W, p, h, routers)
            continue
        if dots1 and l >= cfg.get("first_k_dense_replace", 0):
            x = x + dots1_moe(cfg, W, p, h)
            continue
        g = torch.nn.functional.silu(h @ W[p + "mlp.gate_proj.weight"].T)
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    tied = cfg.get("tie_word_embeddings", False)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    return x @ head.T


def gpt2_logits(cfg, W, tokens):
    B, T = tokens.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    pre = "transformer." if any(n.startswith("transformer.") for n in W) else ""

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (C,), W[name + ".weight"], W[name + ".bias"], eps)

    def conv1d(x, name):  # Conv1D: y = x @ W + b, W stored [in, out]
        return x @ W[name + ".weight"] + W[name + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))

    x = W[pre + "wte.weight"][tokens] + W[pre + "wpe.weight"][torch.arange(T)]
    for l in range(cfg["n_layer"]):
        g = f"{pre}h.{l}."
        h = ln(x, g + "ln_1")
        q, k, v = conv1d(h, g + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        a = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(a, g + "attn.c_proj")
        h = ln(x, g + "ln_2")
        x = x + conv1d(gelu_new(conv1d(h, g + "mlp.c_fc")), g + "mlp.c_proj")
    x = ln(x, pre + "ln_f")
    tied = cfg.get("tie_word_embeddings", True)
    head = W[pre + "wte.weight"] if tied else W["lm_head.weight"]
    return x @ head.T


QKV_BIAS = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")


class HfModel:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            self.cfg = json.load(f)
        arch = self.cfg["architectures"][0]
        assert arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM",
                        "MixtralForCausalLM", "GPT2LMHeadModel", "Qwen3ForCausalLM",
                        "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Dots1ForCausalLM",
                        "Phi3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
                        "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                        "Glm4MoeForCausalLM"), arch
        if glm4_moe_reference.is_glm4_moe(arch):
            self.fn = lambda cfg, W, tokens: glm4_moe_reference.glm4_moe_logits(
                cfg, W, tokens, rope_frequencies)
        elif deepseek_reference.is_deepseek(arch):
            self.fn = lambda cfg, W, tokens: deepseek_reference.deepseek_logits(
                cfg, W, tokens, rope_frequencies)
        elif gemma_reference.is_gemma(arch):
            self.fn = lambda cfg, W, tokens: gemma_reference.gemma_logits(cfg, W, tokens,
                                                                          rope_frequencies)
        elif arch == "GPT2LMHeadModel":
            self.fn = gpt2_logits
        else:
            qkv_bias = arch in QKV_BIAS
            self.fn = lambda cfg, W, tokens: llama_logits(cfg, W, tokens, qkv_bias)
        # float64: the reference's own rounding stays far below the tolerance.
        self.W = {k: torch.tensor(v, dtype=torch.float64) for k, v in read_hf_weights(d).items()}

    def logits(self, tokens):  # [B, T] -> [B*T, V]
        with torch.no_grad():
            out = self.fn(self.cfg, self.W, torch.as_tensor(tokens, dtype=torch.long))
        return out.reshape(-1, out.shape[-1])

    def greedy(self, prompt, n):
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(self.logits(np.array([seq]))[-1].argmax()))
        return seq[len(prompt) :]


# ---- writing a random model ----


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_gpt2_tokenizer(d):
    """A tiny byte-level BPE in GPT-2's vocab.json + merges.txt format."""
    u = bytes_to_unicode()
    vocab = {u[b]: i for i, b in enumerate(u)}  # the 256 bytes, in GPT-2's order
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024}, f)


def write_model(d, spec, ref_path):
    rng = np.random.default_rng(spec.get("seed", 0))
    V, P, L = spec["vocab"], spec["ctx"], spec["layers"]
    C, H = spec["hidden"], spec["heads"]
    KV, F = spec.get("kv_heads", H), spec["ffn"]
    D = spec.get("head_dim") or C // H
    tied = spec["tied"]
    std = spec.get("std", 0.15)

    def mat(*shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def gain(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.05 * rng.standard_normal(n)).astype(np.float32)

    T = []  # (name, array) in the order HF modules define them
    if spec["arch"] in ("gemma2", "gemma3"):
        def gain0(n):  # (1 + w) norms: w near 0
            return (0.1 * rng.standard_normal(n)).astype(np.float32)

        cfg, T = gemma_reference.gemma_model(spec, mat, gain0)
    elif spec["arch"] in ("deepseek_v2", "deepseek_v3"):
        cfg, T = deepseek_reference.deepseek_model(spec, mat, gain)
    elif spec["arch"] == "glm4_moe":
        cfg, T = glm4_moe_reference.glm4_moe_model(spec, mat, gain, bias)
    elif spec["arch"] in ("llama", "qwen2", "mistral", "mixtral", "qwen3", "qwen2_moe",
                          "qwen3_moe", "dots1", "phi3"):
        qwen2 = spec["arch"] in ("qwen2", "qwen2_moe")  # q, k, v biases
        mixtral = spec["arch"] == "mixtral"
        qwen_moe_block = spec["arch"] in ("qwen2_moe", "qwen3_moe")
        qk_norm = spec["arch"] in ("qwen3", "qwen3_moe", "dots1")
        dots1 = spec["arch"] == "dots1"
        first_dense = spec.get("first_dense", 1)
        E, K = spec.get("experts", 4), spec.get("top_k", 2)
        FE, FS = spec.get("moe_ffn", F), spec.get("shared_ffn", 0)
        classes = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
                   "qwen3": "Qwen3ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                   "qwen3_moe": "Qwen3MoeForCausalLM", "dots1": "Dots1ForCausalLM",
                   "phi3": "Phi3ForCausalLM"}
        cfg = {
            "architectures": [classes[spec["arch"]]],
            "model_type": spec["arch"],
            "hidden_size": C,
            "intermediate_size": F,
            "num_hidden_layers": L,
            "num_attention_heads": H,
            "num_key_value_heads": KV,
            "max_position_embeddings": P,
            "rms_norm_eps": spec.get("eps", 1e-5),
            "rope_theta": spec.get("rope_theta", 10000.0),
            "rope_scaling": spec.get("rope_scaling"),
            "hidden_act": "silu",
            "tie_word_embeddings": tied,
            "vocab_size": V,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        if spec.get("head_dim"):
            cfg["head_dim"] = D
        if qwen_moe_block:  # as Qwen1.5-MoE's and Qwen3-30B-A3B's config.json have them
            cfg.update({"use_sliding_window": False, "sliding_window": P, "max_window_layers": L,
                        "decoder_sparse_step": spec.get("sparse_step", 1),
                        "moe_intermediate_size": FE,
                        "num_experts": E, "num_experts_per_tok": K,
                        "norm_topk_prob": spec.get("norm_topk", False),
                        "output_router_logits": False, "router_aux_loss_coef": 0.001,
                        "mlp_only_layers": spec.get("mlp_only", [])})
            if spec["arch"] == "qwen2_moe":
                cfg["shared_expert_intermediate_size"] = FS
            else:
                cfg["attention_bias"] = False
        elif dots1:  # as dots.llm1's config.json has them
            cfg.update({"attention_bias": False, "attention_dropout": 0.0,
                        "sliding_window": None, "max_window_layers": L,
                        "moe_intermediate_size": FE, "n_routed_experts": E,
                        "n_shared_experts": spec.get("shared_experts", 2),
                        "num_experts_per_tok": K, "n_group": spec.get("groups", 1),
                        "topk_group": spec.get("topk_groups", 1),
                        "norm_topk_prob": spec.get("norm_topk", True),
                        "routed_scaling_factor": spec.get("scaling", 1.0),
                        "first_k_dense_replace": first_dense})
        elif spec["arch"] == "qwen3":
            cfg.update({"attention_bias": False, "use_sliding_window": False,
                        "sliding_window": None, "max_window_layers": L})
        elif qwen2:  # as Qwen2's published configs have them
            cfg.update({"use_sliding_window": False, "sliding_window": P, "max_window_layers": L})
        elif spec["arch"] == "mistral":
            cfg["sliding_window"] = spec.get("window")
        elif spec["arch"] == "phi3":  # as Phi-3-mini-4k-instruct's config.json has them
            if spec.get("partial_rotary"):  # as Phi-4-mini's
                cfg["partial_rotary_factor"] = spec["partial_rotary"]
            cfg.update({"sliding_window": spec.get("window"), "attention_bias": False,
                        "original_max_position_embeddings": spec.get("original_ctx", P),
                        "attention_dropout": 0.0,
                        "embd_pdrop": 0.0, "resid_pdrop": 0.0, "pad_token_id": 0})
        elif mixtral:  # as Mixtral 8x7B's config.json has them
            cfg.update({"sliding_window": spec.get("window"), "num_local_experts": E,
                        "num_experts_per_tok": K, "output_router_logits": False,
                        "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0})
        else:
            cfg["attention_bias"] = False
        T.append(("model.embed_tokens.weight", mat(V, C)))
        for l in range(L):
            p = f"model.layers.{l}."
            T.append((p + "input_layernorm.weight", gain(C)))
            for x, rows in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                T.append((p + f"self_attn.{x}_proj.weight", mat(rows, C)))
                if qwen2:  # large, as Qwen2's k biases are: a misplaced one shows
                    T.append((p + f"self_attn.{x}_proj.bias", 10 * bias(rows)))
            if qk_norm:
                T += [(p + "self_attn.q_norm.weight", gain(D)),
                      (p + "self_attn.k_norm.weight", gain(D))]
            if dots1 and l >= first_dense:
                NS = spec.get("shared_experts", 2) * FE
                T += [
                    (p + "self_attn.o_proj.weight", mat(C, H * D)),
                    (p + "post_attention_layernorm.weight", gain(C)),
                    (p + "mlp.gate.weight", mat(E, C)),
                    (p + "mlp.gate.e_score_correction_bias", 2 * bias(E)),
                ]
                for e in range(E):
                    x = f"{p}mlp.experts.{e}."
                    T += [(x + "gate_proj.weight", mat(FE, C)), (x + "up_proj.weight", mat(FE, C)),
                          (x + "down_proj.weight", mat(C, FE))]
                x = p + "mlp.shared_experts."
                T += [(x + "gate_proj.weight", mat(NS, C)), (x + "up_proj.weight", mat(NS, C)),
                      (x + "down_proj.weight", mat(C, NS))]
                continue
            if qwen_moe_block and qwen_sparse_layer(cfg, l):
                T += [
                    (p + "self_attn.o_proj.weight", mat(C, H * D)),
                    (p + "post_attention_layernorm.weight", gain(C)),
                    (p + "mlp.gate.weight", mat(E, C)),
                ]
                for e in range(E):
                    x = f"{p}mlp.experts.{e}."
                    T += [(x + "gate_proj.weight", mat(FE, C)), (x + "up_proj.weight", mat(FE, C)),
                          (x + "down_proj.weight", mat(C, FE))]
                if FS:
                    x = p + "mlp.shared_expert."
                    T += [(x + "gate_proj.weight", mat(FS, C)), (x + "up_proj.weight", mat(FS, C)),
                          (x + "down_proj.weight", mat(C, FS)),
                          (p + "mlp.shared_expert_gate.weight", mat(1, C))]
                continue
            if mixtral:
                T += [
                    (p + "self_attn.o_proj.weight", mat(C, H * D)),
                    (p + "post_attention_layernorm.weight", gain(C)),
                    (p + "block_sparse_moe.gate.weight", mat(E, C)),
                ]
                for e in range(E):
                    x = f"{p}block_sparse_moe.experts.{e}."
                    T += [(x + "w1.weight", mat(F, C)), (x + "w2.weight", mat(C, F)),
                          (x + "w3.weight", mat(F, C))]
                continue
            T += [
                (p + "self_attn.o_proj.weight", mat(C, H * D)),
                (p + "post_attention_layernorm.weight", gain(C)),
                (p + "mlp.gate_proj.weight", mat(F, C)),
                (p + "mlp.up_proj.weight", mat(F, C)),
                (p + "mlp.down_proj.weight", mat(C, F)),
            ]
        if spec["arch"] == "phi3":  # Phi-3 stores q|k|v and gate|up fused, in that order
            fused, parts = [], {}
            for name, a in T:
                m = re.match(r"(.*)\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)\.weight$", name)
                if not m:
                    fused.append((name, a))
                    continue
                attn = m.group(2).startswith("self_attn")
                key = m.group(1) + (".self_attn.qkv_proj.weight" if attn else ".mlp.gate_up_proj.weight")
                if key not in parts:
                    parts[key] = []
                    fused.append((key, None))
                parts[key].append(a)
            T = [(n, a if a is not None else np.concatenate(parts[n], 0)) for n, a in fused]
        T.append(("model.norm.weight", gain(C)))
        if not tied or spec.get("lm_head_copy"):
            T.append(("lm_head.weight", T[0][1].copy() if tied else mat(V, C)))
    else:
        pre = "transformer." if spec.get("prefix", True) else ""
        cfg = {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_embd": C,
            "n_head": H,
            "n_layer": L,
            "n_positions": P,
            "n_ctx": P,
            "n_inner": None if F == 4 * C else F,
            "vocab_size": V,
            "layer_norm_epsilon": spec.get("eps", 1e-5),
            "activation_function": "gelu_new",
            "tie_word_embeddings": tied,
            "bos_token_id": V - 1,
            "eos_token_id": V - 1,
        }
        T += [(pre + "wte.weight", mat(V, C)), (pre + "wpe.weight", mat(P, C))]
        for l in range(L):
            g = f"{pre}h.{l}."
            T += [
                (g + "ln_1.weight", gain(C)),
                (g + "ln_1.bias", bias(C)),
                (g + "attn.c_attn.weight", mat(C, 3 * C)),  # Conv1D: [in, out]
                (g + "attn.c_attn.bias", bias(3 * C)),
                (g + "attn.c_proj.weight", mat(C, C)),
                (g + "attn.c_proj.bias", bias(C)),
                (g + "ln_2.weight", gain(C)),
                (g + "ln_2.bias", bias(C)),
                (g + "mlp.c_fc.weight", mat(C, F)),
                (g + "mlp.c_fc.bias", bias(F)),
                (g + "mlp.c_proj.weight", mat(F, C)),
                (g + "mlp.c_proj.bias", bias(C)),
            ]
            if spec.get("buffers"):  # as in old checkpoints: the causal mask
                T.append((g + "attn.bias", np.tril(np.ones((P, P), np.float32))[None, None]))
                T.append((g + "attn.masked_bias", np.array(-1e4, dtype=np.float32)))
        T += [(pre + "ln_f.weight", gain(C)), (pre + "ln_f.bias", bias(C))]
        if not tied or spec.get("lm_head_copy"):
            T.append(("lm_head.weight", T[0][1].copy() if tied else mat(V, C)))

    dtype = spec.get("dtype", "F32")
    cfg["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    n = spec.get("shards", 1)
    if n == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), T, dtype)
    else:
        per = math.ceil(len(T) / n)
        weight_map, total = {}, 0
        for i in range(n):
            name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            part = T[i * per : (i + 1) * per]
            write_safetensors(os.path.join(d, name), part, dtype)
            for t, a in part:
                weight_map[t] = name
                total += a.size * (4 if dtype == "F32" else 2)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if spec.get("tokenizer") == "gpt2":
        write_gpt2_tokenizer(d)

    # The reference results, from the files as written (bf16/f16 rounding included).
    model = HfModel(d)
    B, S = spec.get("batch", 2), spec.get("seq", 16)
    tokens = rng.integers(0, V, size=(B, S)).astype(np.int32)
    logits = model.logits(tokens).numpy().astype(np.float32)
    prompt = tokens[0, : spec.get("prompt", 5)].copy()
    greedy = np.array(model.greedy(prompt.tolist(), spec.get("new_tokens", 6)), dtype=np.int32)
    write_safetensors(
        ref_path,
        [("tokens", tokens), ("logits", logits), ("prompt", prompt), ("greedy", greedy)],
        "F32",
    )


def check(d, results_path, tol):
    model = HfModel(d)
    R = read_safetensors(results_path)
    ref = model.logits(R["tokens"])
    ours = torch.tensor(R["logits"], dtype=torch.float64)
    diff = (ours - ref).abs().max().item()
    rel = diff / ref.abs().max().item()
    greedy = model.greedy(R["prompt"].tolist(), len(R["greedy"]))
    same = greedy == R["greedy"].tolist()
    print(f"max_abs_diff={diff:.3e} max_rel_diff={rel:.3e} greedy_nekton={R['greedy'].tolist()} "
          f"greedy_reference={greedy}")
    if rel > tol or not same:
        print("MISMATCH")
        return 1
    return 0


def grads(d, batch_path, out_path, aux_coef, z_coef):
    model = HfModel(d)
    R = read_safetensors(batch_path)
    tokens = torch.as_tensor(R["tokens"], dtype=torch.long)
    targets = torch.as_tensor(R["targets"], dtype=torch.long).reshape(-1)
    W = {k: v.clone().requires_grad_(True) for k, v in model.W.items()}
    routers = []
    qkv_bias = model.cfg["architectures"][0] in QKV_BIAS
    arch = model.cfg["architectures"][0]
    if gemma_reference.is_gemma(arch) or deepseek_reference.is_deepseek(arch):
        logits = model.fn(model.cfg, W, tokens)
    else:
        logits = llama_logits(model.cfg, W, tokens, qkv_bias, routers=routers)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
    zero = torch.zeros((), dtype=torch.float64)  # a dense model has no router
    aux = load_balancing_loss(model.cfg, routers) if routers else zero
    z = router_z_loss(routers) if routers else zero
    loss = ce + aux_coef * aux + z_coef * z
    loss.backward()
    out = [("loss", np.array([loss.item(), ce.item(), aux.item(), z.item()]))]
    # A weight the loss does not reach (a score bias that only chooses) has 0.
    out += [(k, v.grad.numpy() if v.grad is not None else np.zeros(v.shape)) for k, v in W.items()]
    write_safetensors(out_path, out, "F32")
    return 0


def logprobs(d, ids_path, k):
    """Prints, per position t >= 1 of the ids in IDS.json, log p(x_t | x_<t)
    and the k most likely ids (float64 log-softmax of the logits), as JSON."""
    model = HfModel(d)
    with open(ids_path) as f:
        ids = json.load(f)
    lp = torch.log_softmax(model.logits(np.array([ids]))[:-1], dim=-1)
    out = []
    for t in range(1, len(ids)):
        row = lp[t - 1]
        top = torch.topk(row, k).indices.tolist() if k else []
        out.append({"logprob": row[ids[t]].item(), "top": top,
                    "top_logprobs": [row[i].item() for i in top]})
    print(json.dumps(out))
    return 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "write":
        with open(sys.argv[3]) as f:
            spec = json.load(f)
        write_model(sys.argv[2], spec, sys.argv[4])
        return 0
    if len(sys.argv) == 7 and sys.argv[1] == "grads":
        return grads(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]),
                     float(sys.argv[6]))
    if len(sys.argv) == 5 and sys.argv[1] == "check":
        return check(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    if len(sys.argv) == 5 and sys.argv[1] == "logprobs":
        return logprobs(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
