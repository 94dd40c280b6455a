"""DeepSeek-V2 and DeepSeek-V3 in float64 torch, written from Hugging Face's
published modelling equations (modeling_deepseek_v2.py / modeling_deepseek_v3.py
and DeepSeek's own modeling_deepseek.py), not from Nekton's code;
hf_reference.py dispatches DeepseekV2ForCausalLM and DeepseekV3ForCausalLM
here for writing random checkpoints, logits and gradients.

  - Multi-head Latent Attention: q = q_proj(h), or q_b_proj(RMSNorm_1e-6(
    q_a_proj(h))) (q_lora_rank); [c_kv | k_pe] = kv_a_proj_with_mqa(h);
    [k_nope | v] = kv_b_proj(RMSNorm_1e-6(c_kv)) per head; q and k each
    [nope | pe] per head, k_pe shared by the heads;
  - RoPE on the pe values only, over qk_rope_head_dim, the pe values first
    de-interleaved (x.view(.., d/2, 2).transpose(-1, -2): evens, then odds),
    then rotate-half; yarn's cos/sin factor mscale(factor, mscale) /
    mscale(factor, mscale_all_dim) when both are set;
  - scores q k^T times qk_head_dim ** -0.5, times mscale(factor,
    mscale_all_dim) ** 2 when rope_scaling has mscale_all_dim;
  - the first first_k_dense_replace layers a SwiGLU MLP, then DeepSeekMoE:
    V2 (greedy): softmax scores, top-k, weights renormalised when
    norm_topk_prob else times routed_scaling_factor; V3 (noaux_tc): sigmoid
    scores, the choice on scores + e_score_correction_bias within the
    topk_group best of n_group groups (each group scored by its two best),
    the unbiased scores renormalised (+1e-20) when norm_topk_prob, times
    routed_scaling_factor; plus the shared experts' MLP.
"""
import math

import torch

DEEPSEEK_CLASSES = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def is_deepseek(arch_class):
    return arch_class in DEEPSEEK_CLASSES.values()


def yarn_mscale(factor, m):
    return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0


def deepseek_model(spec, mat, gain):
    """(config.json, [(name, array)] in module order) of a random model."""
    v3 = spec["arch"] == "deepseek_v3"
    V, P, L = spec["vocab"], spec["ctx"], spec["layers"]
    C, H, F = spec["hidden"], spec["heads"], spec["ffn"]
    nope, rope, vd = spec.get("nope", 16), spec.get("rope", 8), spec.get("v_dim", 12)
    rq, rkv = spec.get("q_rank"), spec.get("kv_rank", 24)
    E, K, FE = spec.get("experts", 8), spec.get("top_k", 2), spec.get("moe_ffn", 16)
    NS = spec.get("shared_experts", 2)
    first = spec.get("first_dense", 1)
    cfg = {
        "architectures": [DEEPSEEK_CLASSES[spec["arch"]]],
        "model_type": spec["arch"],
        "vocab_size": V,
        "hidden_size": C,
        "intermediate_size": F,
        "moe_intermediate_size": FE,
        "num_hidden_layers": L,
        "num_attention_heads": H,
        "num_key_value_heads": H,
        "n_shared_experts": NS,
        "n_routed_experts": E,
        "routed_scaling_factor": spec.get("scaling", 1.0),
        "kv_lora_rank": rkv,
        "q_lora_rank": rq,
        "qk_rope_head_dim": rope,
        "v_head_dim": vd,
        "qk_nope_head_dim": nope,
        "topk_method": "noaux_tc" if v3 else "greedy",
        "n_group": spec.get("groups", 1),
        "topk_group": spec.get("topk_groups", 1),
        "num_experts_per_tok": K,
        "moe_layer_freq": 1,
        "first_k_dense_replace": first,
        "norm_topk_prob": spec.get("norm_topk", v3),
        "scoring_func": "sigmoid" if v3 else "softmax",
        "hidden_act": "silu",
        "max_position_embeddings": P,
        "initializer_range": 0.02,
        "rms_norm_eps": spec.get("eps", 1e-6),
        "tie_word_embeddings": spec["tied"],
        "rope_theta": spec.get("rope_theta", 10000.0),
        "rope_scaling": spec.get("rope_scaling"),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if not v3:
        cfg["aux_loss_alpha"] = 0.001
        cfg["seq_aux"] = True
    T = [("model.embed_tokens.weight", mat(V, C))]
    D = nope + rope
    for l in range(L):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        T.append((p + "input_layernorm.weight", gain(C)))
        if rq:
            T += [(a + "q_a_proj.weight", mat(rq, C)), (a + "q_a_layernorm.weight", gain(rq)),
                  (a + "q_b_proj.weight", mat(H * D, rq))]
        else:
            T.append((a + "q_proj.weight", mat(H * D, C)))
        T += [(a + "kv_a_proj_with_mqa.weight", mat(rkv + rope, C)),
              (a + "kv_a_layernorm.weight", gain(rkv)),
              (a + "kv_b_proj.weight", mat(H * (nope + vd), rkv)),
              (a + "o_proj.weight", mat(C, H * vd)),
              (p + "post_attention_layernorm.weight", gain(C))]
        m = p + "mlp."
        if l < first:
            T += [(m + "gate_proj.weight", mat(F, C)), (m + "up_proj.weight", mat(F, C)),
                  (m + "down_proj.weight", mat(C, F))]
            continue
        T.append((m + "gate.weight", mat(E, C)))
        if v3:
            T.append((m + "gate.e_score_correction_bias", mat(E)))
        for e in range(E):
            x = f"{m}experts.{e}."
            T += [(x + "gate_proj.weight", mat(FE, C)), (x + "up_proj.weight", mat(FE, C)),
                  (x + "down_proj.weight", mat(C, FE))]
        x = m + "shared_experts."
        T += [(x + "gate_proj.weight", mat(NS * FE, C)), (x + "up_proj.weight", mat(NS * FE, C)),
              (x + "down_proj.weight", mat(C, NS * FE))]
    T.append(("model.norm.weight", gain(C)))
    if not spec["tied"]:
        T.append(("lm_head.weight", mat(V, C)))
    return cfg, T


def deepseek_moe(cfg, W, m, x):
    v3 = cfg["architectures"][0] == "DeepseekV3ForCausalLM"
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    logits = x @ W[m + "gate.weight"].T
    if v3:
        G, TG = cfg["n_group"], cfg["topk_group"]
        scores = torch.sigmoid(logits)
        choice = scores + W[m + "gate.e_score_correction_bias"][None]
        group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = group_scores.topk(TG, dim=-1)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
        keep = group_mask[:, :, None].expand(-1, G, E // G).reshape(-1, E)
        top_i = choice.masked_fill(keep == 0, 0.0).topk(k, dim=-1)[1]
        top_w = scores.gather(1, top_i)
        if cfg.get("norm_topk_prob"):
            top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
        top_w = top_w * cfg["routed_scaling_factor"]
    else:
        scores = torch.softmax(logits, dim=-1)
        top_w, top_i = scores.topk(k, dim=-1)
        if k > 1 and cfg.get("norm_topk_prob"):
            top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            top_w = top_w * cfg["routed_scaling_factor"]

    def mlp(y, pre):
        g = torch.nn.functional.silu(y @ W[pre + "gate_proj.weight"].T)
        return (g * (y @ W[pre + "up_proj.weight"].T)) @ W[pre + "down_proj.weight"].T

    out = torch.zeros_like(x)
    for e in range(E):
        weight = (top_w * (top_i == e)).sum(dim=-1, keepdim=True)
        out = out + weight * mlp(x, f"{m}experts.{e}.")
    return out + mlp(x, m + "shared_experts.")


def deepseek_logits(cfg, W, tokens, rope_frequencies):
    B, T = tokens.shape
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    rkv, rq = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
    D = nope + rope
    eps = cfg.get("rms_norm_eps", 1e-6)

    def rms(x, w, e=eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e))

    def rotate_half(x):
        return torch.cat((-x[..., rope // 2 :], x[..., : rope // 2]), dim=-1)

    def deinterleave(x):
        return x.view(*x.shape[:-1], rope // 2, 2).transpose(-1, -2).reshape(x.shape)

    rs = dict(cfg.get("rope_scaling") or {})
    scaling = D ** -0.5
    if rs:
        factor = rs.get("factor", 1.0)
        if rs.get("mscale") and rs.get("mscale_all_dim") and rs.get("attention_factor") is None:
            rs["attention_factor"] = yarn_mscale(factor, rs["mscale"]) / yarn_mscale(
                factor, rs["mscale_all_dim"])
        if rs.get("mscale_all_dim"):
            scaling = scaling * yarn_mscale(factor, rs["mscale_all_dim"]) ** 2
    inv_freq, scale = rope_frequencies(dict(cfg, rope_scaling=rs or None), rope, T)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    x = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        h = rms(x, W[p + "input_layernorm.weight"])
        if rq:
            q = rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], 1e-6)
            q = q @ W[a + "q_b_proj.weight"].T
        else:
            q = h @ W[a + "q_proj.weight"].T
        q = q.view(B, T, H, D).transpose(1, 2)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        kva = h @ W[a + "kv_a_proj_with_mqa.weight"].T
        ckv, k_pe = kva[..., :rkv], kva[..., rkv:]
        kv = rms(ckv, W[a + "kv_a_layernorm.weight"], 1e-6) @ W[a + "kv_b_proj.weight"].T
        kv = kv.view(B, T, H, nope + vd).transpose(1, 2)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        q_pe = deinterleave(q_pe)
        k_pe = deinterleave(k_pe.view(B, 1, T, rope))
        q_pe = q_pe * cos + rotate_half(q_pe) * sin
        k_pe = k_pe * cos + rotate_half(k_pe) * sin
        query = torch.cat((q_nope, q_pe), dim=-1)
        key = torch.cat((k_nope, k_pe.expand(B, H, T, rope)), dim=-1)
        s = (query @ key.transpose(-1, -2)) * scaling
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v
        x = x + o.transpose(1, 2).reshape(B, T, H * vd) @ W[a + "o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        if l >= cfg.get("first_k_dense_replace", 0):
            x = x + deepseek_moe(cfg, W, m, h.reshape(-1, C)).view(B, T, C)
            continue
        g = torch.nn.functional.silu(h @ W[m + "gate_proj.weight"].T)
        x = x + (g * (h @ W[m + "up_proj.weight"].T)) @ W[m + "down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return x @ head.T
