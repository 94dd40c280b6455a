"""Gemma 2 and Gemma 3 (text) in float64 torch, written from Hugging Face's
published modelling equations (modeling_gemma2.py, modeling_gemma3.py), not
from Nekton's code; hf_reference.py dispatches Gemma2ForCausalLM and
Gemma3ForCausalLM here for writing random checkpoints, logits and gradients.

  - Gemma*RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), in float32 upwards;
  - the MLP: down(gelu_pytorch_tanh(gate x) * up x);
  - each decoder layer: x + post_attention_layernorm(attn(input_layernorm x)),
    then x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm x));
  - the embeddings times hidden_size ** 0.5 (a tensor of the weights' dtype);
  - attention scores q k^T * query_pre_attn_scalar ** -0.5, soft-capped as
    tanh(s / c) * c when attn_logit_softcapping is set, local layers masking
    keys j <= i - sliding_window (Gemma 2: even layers local; Gemma 3: layer l
    local unless (l + 1) % sliding_window_pattern == 0, or layer_types);
  - Gemma 3: q_norm / k_norm (the same RMSNorm) over each head before RoPE,
    the local layers' RoPE from rope_local_base_freq (default rope type), the
    global layers' from rope_theta and rope_scaling;
  - the head tied to the embedding, logits soft-capped by
    final_logit_softcapping when set.
"""
import math

import torch

GEMMA_CLASSES = {"gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
GEMMA_TYPES = {"gemma2": "gemma2", "gemma3": "gemma3_text"}


def is_gemma(arch_class):
    return arch_class in GEMMA_CLASSES.values()


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def layer_is_sliding(cfg, l):
    if cfg.get("layer_types"):
        return cfg["layer_types"][l] == "sliding_attention"
    if cfg["architectures"][0] == "Gemma2ForCausalLM":
        return l % 2 == 0
    return (l + 1) % cfg.get("sliding_window_pattern", 6) != 0


def gemma_logits(cfg, W, tokens, rope_frequencies):
    B, T = tokens.shape
    gemma3 = cfg["architectures"][0] == "Gemma3ForCausalLM"
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or 256
    eps = cfg.get("rms_norm_eps", 1e-6)
    scaling = cfg.get("query_pre_attn_scalar", 256) ** -0.5
    attn_cap = cfg.get("attn_logit_softcapping")
    final_cap = cfg.get("final_logit_softcapping")
    window = cfg.get("sliding_window")

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)

    def rotate_half(x):
        return torch.cat((-x[..., D // 2 :], x[..., : D // 2]), dim=-1)

    def cos_sin(c):
        inv, scale = rope_frequencies(c, D)
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * scale, emb.sin() * scale

    rope_global = cos_sin(cfg)
    local_cfg = {"rope_theta": cfg.get("rope_local_base_freq", 10000.0)} if gemma3 else cfg
    rope_local = cos_sin(local_cfg)

    causal = torch.ones(T, T, dtype=torch.bool).tril()
    sliding = causal & ~torch.ones(T, T, dtype=torch.bool).tril(-window) if window else causal

    x = W["model.embed_tokens.weight"][tokens] * (C ** 0.5)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        local = layer_is_sliding(cfg, l)
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        if gemma3:
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        cos, sin = rope_local if local and gemma3 else rope_global
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = H // KV
        k = k[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        v = v[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        s = q @ k.transpose(-1, -2) * scaling
        if attn_cap:
            s = torch.tanh(s / attn_cap) * attn_cap
        mask = sliding if local else causal
        s = s.masked_fill(~mask, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        a = a @ W[p + "self_attn.o_proj.weight"].T
        x = x + rms(a, W[p + "post_attention_layernorm.weight"])
        h = rms(x, W[p + "pre_feedforward_layernorm.weight"])
        g = gelu_tanh(h @ W[p + "mlp.gate_proj.weight"].T)
        m = (g * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
        x = x + rms(m, W[p + "post_feedforward_layernorm.weight"])
    x = rms(x, W["model.norm.weight"])
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    logits = x @ head.T
    if final_cap:
        logits = torch.tanh(logits / final_cap) * final_cap
    return logits


def gemma_model(spec, mat, gain0):
    """(config.json, [(name, array)]) of a random Gemma as SPEC asks; gain0(n):
    norm weights near 0 (the (1 + w) form)."""
    arch = spec["arch"]
    gemma3 = arch == "gemma3"
    V, P, L = spec["vocab"], spec["ctx"], spec["layers"]
    C, H = spec["hidden"], spec["heads"]
    KV, F = spec.get("kv_heads", H), spec["ffn"]
    D = spec.get("head_dim", 256)
    cfg = {
        "architectures": [GEMMA_CLASSES[arch]],
        "model_type": GEMMA_TYPES[arch],
        "hidden_size": C,
        "intermediate_size": F,
        "num_hidden_layers": L,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "head_dim": D,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": P,
        "rms_norm_eps": spec.get("eps", 1e-6),
        "rope_theta": spec.get("rope_theta", 1e6 if gemma3 else 10000.0),
        "rope_scaling": spec.get("rope_scaling"),
        "attention_bias": False,
        "query_pre_attn_scalar": spec.get("qpas", D),
        "sliding_window": spec["window"],
        "attn_logit_softcapping": spec.get("attn_cap", None if gemma3 else 50.0),
        "final_logit_softcapping": spec.get("final_cap", None if gemma3 else 30.0),
        "tie_word_embeddings": True,
        "vocab_size": V,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    if gemma3:
        cfg["rope_local_base_freq"] = spec.get("rope_local", 10000.0)
        cfg["sliding_window_pattern"] = spec.get("pattern", 6)
    if spec.get("layer_types"):
        cfg["layer_types"] = spec["layer_types"]
    T = [("model.embed_tokens.weight", mat(V, C))]
    for l in range(L):
        p = f"model.layers.{l}."
        T.append((p + "input_layernorm.weight", gain0(C)))
        T.append((p + "self_attn.q_proj.weight", mat(H * D, C)))
        T.append((p + "self_attn.k_proj.weight", mat(KV * D, C)))
        T.append((p + "self_attn.v_proj.weight", mat(KV * D, C)))
        if gemma3:
            T += [(p + "self_attn.q_norm.weight", gain0(D)), (p + "self_attn.k_norm.weight", gain0(D))]
        T += [
            (p + "self_attn.o_proj.weight", mat(C, H * D)),
            (p + "post_attention_layernorm.weight", gain0(C)),
            (p + "pre_feedforward_layernorm.weight", gain0(C)),
            (p + "mlp.gate_proj.weight", mat(F, C)),
            (p + "mlp.up_proj.weight", mat(F, C)),
            (p + "mlp.down_proj.weight", mat(C, F)),
            (p + "post_feedforward_layernorm.weight", gain0(C)),
        ]
    T.append(("model.norm.weight", gain0(C)))
    return cfg, T
