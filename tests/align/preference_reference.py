#!/usr/bin/python3
"""Independent float64 PyTorch reference of Nekton's preference losses, used by
preference_parity_test.cc. It reads a tiny model, a micro-batch of preference
rows (rows 2i, 2i+1: chosen and rejected, or KTO's example and its mismatched
KL sequence), the method's settings and Nekton's results from a folder; runs
the policy (tests/model/torch_reference.py's independent model) in float64,
the loss written here from the papers and TRL's definitions, its gradient by
autograd, and 5 AdamW steps with global-norm clipping; and exits non-zero if
a step's loss or a final weight differs by more than the tolerance.

Formulas (z: policy minus reference log-ratio difference, b: beta):
  DPO sigmoid  -(1-ls) log s(b z) - ls log s(-b z)        (cDPO)
      robust   (-(1-ls) log s(b z) + ls log s(-b z)) / (1 - 2 ls)
      hinge    relu(1 - b z)
      ipo      (z_avg - 1/(2b))^2, log-ratios divided by completion lengths
      rpo      + alpha * mean NLL of the chosen completion tokens
  KTO          w_d (1 - s(b (r - KL))), w_u (1 - s(b (KL - r))), KL = max(0,
               mean KL-row log-ratio), detached
  ORPO         NLL(chosen) - b mean log s(log odds), on mean token log-probs
  SimPO        -log s(b (c_avg - r_avg) - gamma) (+ cpo_alpha NLL)
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from safetensors_np import read_safetensors as read_numpy  # noqa: E402
from torch_reference import forward, objective_parity  # noqa: E402


def read(path):
    return {k: torch.tensor(v) for k, v in read_numpy(path).items()}


def row_logps(cfg, P, tokens, targets):
    """Sum of log p(target) over each row's non-ignored targets, and their count."""
    logits = forward(cfg, P, tokens)
    logp = torch.log_softmax(logits, dim=-1)
    mask = targets != -100
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1), mask.sum(-1).to(torch.float64)


def loss_of(s, logp, ref, n_tok, labels):
    b = s["beta"]
    c, r = logp[0::2], logp[1::2]
    tc, tr = n_tok[0::2], n_tok[1::2]
    method = s["method"]

    def nll():
        return -c.sum() / tc.sum()

    if method == "dpo":
        c0, r0 = ref[0::2], ref[1::2]
        z = (c - c0) - (r - r0)
        ls, kind = s["label_smoothing"], s["loss_type"]
        if kind == "sigmoid":
            per = -(1 - ls) * F.logsigmoid(b * z) - ls * F.logsigmoid(-b * z)
        elif kind == "robust":
            per = (-(1 - ls) * F.logsigmoid(b * z) + ls * F.logsigmoid(-b * z)) / (1 - 2 * ls)
        elif kind == "hinge":
            per = torch.relu(1 - b * z)
        else:
            zi = (c - c0) / tc - (r - r0) / tr
            per = (zi - 1 / (2 * b)) ** 2
        loss = per.mean()
        if s["rpo_alpha"] > 0:
            loss = loss + s["rpo_alpha"] * nll()
        return loss
    if method == "kto":
        d = c - ref[0::2]
        kl = (r - ref[1::2]).mean().detach().clamp(min=0)
        lab = labels.bool()
        per = torch.where(lab, s["desirable_weight"] * (1 - torch.sigmoid(b * (d - kl))),
                          s["undesirable_weight"] * (1 - torch.sigmoid(b * (kl - d))))
        return per.mean()
    ca, ra = c / tc, r / tr
    if method == "orpo":
        log_odds = (ca - ra) - (torch.log(-torch.expm1(ca)) - torch.log(-torch.expm1(ra)))
        return nll() - b * F.logsigmoid(log_odds).mean()
    assert method == "simpo", method
    ls = s["label_smoothing"]
    u = b * (ca - ra) - s["simpo_gamma"]
    loss = (-(1 - ls) * F.logsigmoid(u) - ls * F.logsigmoid(-u)).mean()
    if s["cpo_alpha"] > 0:
        loss = loss + s["cpo_alpha"] * nll()
    return loss


def main(folder, tol):
    s = json.load(open(f"{folder}/settings.json"))
    batch = read(f"{folder}/batch.safetensors")
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    labels = batch["labels"] if "labels" in batch else None

    def make_loss(cfg, P0):
        with torch.no_grad():
            ref, _ = row_logps(cfg, P0, tokens, targets)  # the initial model is the reference

        def loss_fn(P):
            logp, n_tok = row_logps(cfg, P, tokens, targets)
            return loss_of(s, logp, ref, n_tok, labels)
        return loss_fn

    objective_parity(folder, tol, make_loss)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
