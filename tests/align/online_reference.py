#!/usr/bin/python3
"""Independent float64 PyTorch reference of Nekton's online RL losses (GRPO,
RLOO, PPO), used by online_parity_test.cc. From a folder: a tiny model, fixed
rollouts (rows of prompt + completion tokens, targets on the completion), each
rollout's reward and group, and the settings; the advantages computed here
from the rewards, the policy (tests/model/torch_reference.py) in float64 at
the sampling temperature, old and reference log-probabilities from the
initial weights and a reference model's (FOLDER/ref, detached), the loss written from the published formulas,
its gradient by autograd and 5 AdamW steps; exits non-zero if a step's loss
or a final weight differs by more than the tolerance.

  GRPO  A_i = (r_i - mean_g) / (std_g + 1e-4)   (torch.std: unbiased)
        scale_rewards=batch: std over every reward; none: not divided
  RLOO  A_i = r_i - mean of the group's others; with kl_coef the reward
        first loses kl_coef * sum_t (old_t - ref_t)
  per token: rho = exp(logp - old)
        l = -min(rho A, clamp(rho, 1 - eps_low, 1 + eps_high) A)
            + beta (exp(ref - logp) - (ref - logp) - 1)   (GRPO, beta > 0)
  grpo     mean over sequences of the token mean
  dr_grpo  sum / (sequences * max_completion_length)
  dapo     sum / tokens
  PPO   value head v_t = ln_f(x_t) . w + b at each completion token's state
        (with FOLDER/critic, a separate critic's: its score head over its
        own final norm, its weights optimised with the policy's);
        per-token reward -kl_coef (old - ref), the score added at the last
        token (optionally whitened over the batch, mean kept); GAE(gamma,
        lambda) with the initial weights' values, returns = A + V; A whitened
        (unbiased variance, + 1e-8); loss per token: the clipped policy term
        + vf_coef 0.5 max((v - R)^2, (clamp(v, V - c, V + c) - R)^2)
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from safetensors_np import read_safetensors as read_numpy  # noqa: E402
from torch_reference import forward, objective_parity  # noqa: E402


def read(path):
    return {k: torch.tensor(v) for k, v in read_numpy(path).items()}


def token_logps(cfg, P, tokens, targets, temperature):
    logits = forward(cfg, P, tokens) / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)


def token_logps_values(cfg, P, tokens, targets, temperature):
    logits, x = forward(cfg, P, tokens, with_hidden=True)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    v = (x @ P["value_head.weight"].t()).squeeze(-1) + P["value_head.bias"]
    return logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1), v


def policy_and_critic(folder, P):
    """P's policy weights, and PPO's separate critic (FOLDER/critic: a
    one-label sequence classifier read at every position; its weights are
    P's "critic.NAME") as a function tokens -> values [B, T], or None."""
    policy = {k: v for k, v in P.items() if not k.startswith("critic.")}
    if not os.path.exists(f"{folder}/critic/config.json"):
        return policy, None
    ccfg = json.load(open(f"{folder}/critic/config.json"))
    C = {k[len("critic."):]: v for k, v in P.items() if k.startswith("critic.")}
    return policy, lambda tokens: forward(ccfg, C, tokens).squeeze(-1)


def whiten(x, mask, shift_mean):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) ** 2) * mask).sum() / n * n / (n - 1)
    w = (x - mean) * torch.rsqrt(var + 1e-8)
    return w if shift_mean else w + mean


def ppo_targets(s, rewards, old, ref, values, mask):
    """Whitened GAE advantages and returns [B, T] on the completion tokens."""
    B, T = mask.shape
    rw = -s["kl_coef"] * (old - ref) * mask
    for b in range(B):
        last = int(mask[b].nonzero().max())
        rw[b, last] += rewards[b]
    if s["whiten_rewards"]:
        rw = whiten(rw, mask, False) * mask
    adv = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        idx = mask[b].nonzero().flatten().tolist()
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(idx):
            delta = rw[b, t] + s["gamma"] * nxt_v - values[b, t]
            adv[b, t] = delta + s["gamma"] * s["lam"] * nxt_a
            nxt_v, nxt_a = values[b, t], adv[b, t]
    ret = adv + values
    return whiten(adv, mask, True) * mask, ret


def advantages(s, rewards):
    G = s["G"]
    r = rewards.view(-1, G)
    if s["algorithm"] == "rloo":
        others = (r.sum(1, keepdim=True) - r) / (G - 1)
        return (r - others).reshape(-1)
    a = r - r.mean(1, keepdim=True)
    if s["scale_rewards"] == "group":
        a = a / (r.std(1, keepdim=True) + 1e-4)
    a = a.reshape(-1)
    if s["scale_rewards"] == "batch":
        a = a / (rewards.std() + 1e-4)
    return a


def main(folder, tol):
    s = json.load(open(f"{folder}/settings.json"))
    batch = read(f"{folder}/batch.safetensors")
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    rewards = batch["rewards"].double()
    mask = (targets != -100).double()
    lo, hi, beta = 1 - s["epsilon_low"], 1 + s["epsilon_high"], s["kl_coef"]

    def logps_values(cfg, P):
        policy, critic = policy_and_critic(folder, P)
        if critic is None:
            return token_logps_values(cfg, policy, tokens, targets, s["temperature"])
        return token_logps(cfg, policy, tokens, targets, s["temperature"]), critic(tokens)

    def make_ppo_loss(cfg, P0):
        with torch.no_grad():
            old, vold = logps_values(cfg, P0)
            R = {k: v.double() for k, v in read(f"{folder}/ref/model.safetensors").items()}
            ref = token_logps(cfg, R, tokens, targets, s["temperature"])
            A, ret = ppo_targets(s, rewards, old, ref, vold, mask)
        cv = s["cliprange_value"]

        def loss_fn(P):
            logp, v = logps_values(cfg, P)
            rho = torch.exp(logp - old)
            pg = torch.max(-A * rho, -A * torch.clamp(rho, lo, hi))
            vc = vold + torch.clamp(v - vold, -cv, cv)
            vf = 0.5 * torch.max((v - ret) ** 2, (vc - ret) ** 2)
            per = (pg + s["vf_coef"] * vf) * mask
            if s["loss_type"] == "grpo":
                return (per.sum(-1) / mask.sum(-1)).mean()
            if s["loss_type"] == "dr_grpo":
                return per.sum() / (per.shape[0] * s["max_tokens"])
            return per.sum() / mask.sum()
        return loss_fn

    def make_loss(cfg, P0):
        if s["algorithm"] == "ppo":
            return make_ppo_loss(cfg, P0)
        with torch.no_grad():
            old = token_logps(cfg, P0, tokens, targets, s["temperature"])
            R = {k: v.double() for k, v in read(f"{folder}/ref/model.safetensors").items()}
            ref = token_logps(cfg, R, tokens, targets, s["temperature"])
            r = rewards.clone()
            if s["algorithm"] == "rloo" and beta > 0:
                r = r - beta * ((old - ref) * mask).sum(-1)
            A = advantages(s, r).unsqueeze(-1)

        def loss_fn(P):
            logp = token_logps(cfg, P, tokens, targets, s["temperature"])
            rho = torch.exp(logp - old)
            per = -torch.min(rho * A, torch.clamp(rho, lo, hi) * A)
            if s["algorithm"] == "grpo" and beta > 0:
                d = ref - logp
                per = per + beta * (torch.exp(d) - d - 1)
            per = per * mask
            n = mask.sum(-1)
            if s["loss_type"] == "grpo":
                return (per.sum(-1) / n).mean()
            if s["loss_type"] == "dr_grpo":
                return per.sum() / (per.shape[0] * s["max_tokens"])
            return per.sum() / mask.sum()
        return loss_fn

    objective_parity(folder, tol, make_loss)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
