"""GLM-4.5 (Glm4MoeForCausalLM) in float64 torch, written from Hugging Face's
published modelling equations (transformers' modeling_glm4_moe.py), not
from Nekton's code; hf_reference.py dispatches Glm4MoeForCausalLM here for
writing random checkpoints and computing logits.

  - attention: q, k, v = x W^T + b (attention_bias), o_proj without bias;
    with use_qk_norm an RMSNorm (eps rms_norm_eps) over each head's head_dim
    values of q and of k, before RoPE; scores times head_dim ** -0.5;
    grouped-query heads by repeating each key/value head;
  - partial rotary: the rotary embedding's dim = int(head_dim x
    partial_rotary_factor), inverse frequencies theta^(-2i/dim) over that
    dim (RoPE scaling from the same init functions); apply_rotary_pos_emb
    (GPT-NeoX's): q_rot = q[..., :dim] as q_rot cos + rotate_half(q_rot) sin,
    rotate_half over dim, q_pass = q[..., dim:] unchanged, concatenated;
  - the first first_k_dense_replace layers a SwiGLU MLP of
    intermediate_size, then Glm4MoeMoE: sigmoid(router x) scores (router in
    f32 there, f64 here), the choice on scores + e_score_correction_bias
    within the topk_group best of n_group groups (each group scored by the
    sum of its two best), the unbiased scores of the top k, divided by their
    sum + 1e-20 when norm_topk_prob, times routed_scaling_factor, weighting
    the experts; plus the shared experts' MLP of n_shared_experts x
    moe_intermediate_size, ungated;
  - layers past num_hidden_layers (num_nextn_predict_layers' multi-token
    prediction) are in the checkpoint and not run.
"""
import math

import numpy as np
import torch

CLASS = "Glm4MoeForCausalLM"


def is_glm4_moe(arch_class):
    return arch_class == CLASS


def rotary_dim(cfg):
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    D = cfg.get("head_dim") or C // H
    return int(D * cfg.get("partial_rotary_factor", 0.5))


def glm4_moe_block(cfg, W, m, x):
    """Glm4MoeMoE on x [N, C]."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, TG = cfg.get("n_group", 1), cfg.get("topk_group", 1)
    scores = torch.sigmoid(x @ W[m + "gate.weight"].T)
    choice = scores + W[m + "gate.e_score_correction_bias"][None]
    group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = group_scores.topk(TG, dim=-1)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    keep = group_mask[:, :, None].expand(-1, G, E // G).reshape(-1, E)
    top_i = choice.masked_fill(keep == 0, 0.0).topk(k, dim=-1)[1]
    top_w = scores.gather(1, top_i)
    if cfg.get("norm_topk_prob", True):
        top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
    top_w = top_w * cfg.get("routed_scaling_factor", 1.0)

    def mlp(y, pre):
        g = torch.nn.functional.silu(y @ W[pre + "gate_proj.weight"].T)
        return (g * (y @ W[pre + "up_proj.weight"].T)) @ W[pre + "down_proj.weight"].T

    out = torch.zeros_like(x)
    for e in range(E):
        weight = (top_w * (top_i == e)).sum(dim=-1, keepdim=True)
        out = out + weight * mlp(x, f"{m}experts.{e}.")
    return out + mlp(x, m + "shared_experts.")


def glm4_moe_logits(cfg, W, tokens, rope_frequencies):
    B, T = tokens.shape
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    R = rotary_dim(cfg)
    eps = cfg.get("rms_norm_eps", 1e-5)
    qk_norm = cfg.get("use_qk_norm", False)
    bias = cfg.get("attention_bias", False)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):  # over the rotated part's R values
        return torch.cat((-x[..., R // 2 :], x[..., : R // 2]), dim=-1)

    def proj(h, name):
        y = h @ W[name + ".weight"].T
        return y + W[name + ".bias"] if bias else y

    inv_freq, scale = rope_frequencies(cfg, R, T)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale

    def rope(q):
        q_rot, q_pass = q[..., :R], q[..., R:]
        return torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q_pass), dim=-1)

    x = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = proj(h, p + "self_attn.q_proj").view(B, T, H, D)
        k = proj(h, p + "self_attn.k_proj").view(B, T, KV, D)
        v = proj(h, p + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        if qk_norm:
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = rope(q.transpose(1, 2)), rope(k.transpose(1, 2))
        rep = H // KV
        k = k[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        v = v[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        scores = q @ k.transpose(-1, -2) * D**-0.5
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        if l >= cfg.get("first_k_dense_replace", 1):
            x = x + glm4_moe_block(cfg, W, p + "mlp.", h.reshape(B * T, C)).view(B, T, C)
            continue
        g = torch.nn.functional.silu(h @ W[p + "mlp.gate_proj.weight"].T)
        x = x + (g * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    tied = cfg.get("tie_word_embeddings", False)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    return x @ head.T


def glm4_moe_model(spec, mat, gain, bias):
    """(config.json, [(name, array)] in module order) of a random model; with
    spec["mtp"] > 0 that many multi-token-prediction layers' tensors follow
    (GLM-4.5's layout: a decoder layer plus enorm, hnorm, eh_proj and
    shared_head.norm), unused by the model."""
    V, P, L = spec["vocab"], spec["ctx"], spec["layers"]
    C, H = spec["hidden"], spec["heads"]
    KV, F = spec.get("kv_heads", H), spec["ffn"]
    D = spec.get("head_dim") or C // H
    E, K, FE = spec.get("experts", 8), spec.get("top_k", 2), spec.get("moe_ffn", 16)
    NS = spec.get("shared_experts", 1)
    first = spec.get("first_dense", 1)
    qk_norm = spec.get("qk_norm", True)
    mtp = spec.get("mtp", 0)
    cfg = {
        "architectures": [CLASS],
        "model_type": "glm4_moe",
        "vocab_size": V,
        "hidden_size": C,
        "intermediate_size": F,
        "num_hidden_layers": L,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "head_dim": D,
        "partial_rotary_factor": spec.get("partial_rotary", 0.5),
        "hidden_act": "silu",
        "max_position_embeddings": P,
        "rms_norm_eps": spec.get("eps", 1e-5),
        "rope_theta": spec.get("rope_theta", 1000000.0),
        "rope_scaling": spec.get("rope_scaling"),
        "attention_bias": True,
        "attention_dropout": 0.0,
        "use_qk_norm": qk_norm,
        "moe_intermediate_size": FE,
        "n_routed_experts": E,
        "n_shared_experts": NS,
        "num_experts_per_tok": K,
        "n_group": spec.get("groups", 1),
        "topk_group": spec.get("topk_groups", 1),
        "norm_topk_prob": spec.get("norm_topk", True),
        "routed_scaling_factor": spec.get("scaling", 1.0),
        "first_k_dense_replace": first,
        "num_nextn_predict_layers": mtp,
        "tie_word_embeddings": spec["tied"],
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    T = [("model.embed_tokens.weight", mat(V, C))]

    def layer(l, moe):
        p = f"model.layers.{l}."
        out = [(p + "input_layernorm.weight", gain(C))]
        for x, rows in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            out.append((p + f"self_attn.{x}_proj.weight", mat(rows, C)))
            # large, as GLM's k biases are: a misplaced one shows
            out.append((p + f"self_attn.{x}_proj.bias", 10 * bias(rows)))
        out.append((p + "self_attn.o_proj.weight", mat(C, H * D)))
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", gain(D)),
                    (p + "self_attn.k_norm.weight", gain(D))]
        out.append((p + "post_attention_layernorm.weight", gain(C)))
        if not moe:
            return out + [(p + "mlp.gate_proj.weight", mat(F, C)),
                          (p + "mlp.up_proj.weight", mat(F, C)),
                          (p + "mlp.down_proj.weight", mat(C, F))]
        out += [(p + "mlp.gate.weight", mat(E, C)),
                (p + "mlp.gate.e_score_correction_bias", 2 * bias(E))]
        for e in range(E):
            x = f"{p}mlp.experts.{e}."
            out += [(x + "gate_proj.weight", mat(FE, C)), (x + "up_proj.weight", mat(FE, C)),
                    (x + "down_proj.weight", mat(C, FE))]
        x = p + "mlp.shared_experts."
        return out + [(x + "gate_proj.weight", mat(NS * FE, C)),
                      (x + "up_proj.weight", mat(NS * FE, C)),
                      (x + "down_proj.weight", mat(C, NS * FE))]

    for l in range(L):
        T += layer(l, l >= first)
    for l in range(L, L + mtp):
        p = f"model.layers.{l}."
        T += layer(l, True)
        T += [(p + "enorm.weight", gain(C)), (p + "hnorm.weight", gain(C)),
              (p + "eh_proj.weight", mat(C, 2 * C)),
              (p + "shared_head.norm.weight", gain(C))]
    T.append(("model.norm.weight", gain(C)))
    if not spec["tied"]:
        T.append(("lm_head.weight", mat(V, C)))
    return cfg, T
