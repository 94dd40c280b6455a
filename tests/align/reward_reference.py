#!/usr/bin/python3
"""Independent float64 PyTorch reference of Nekton's reward-model training,
used by reward_parity_test.cc. It reads a tiny sequence classifier (a score
head [1, C] in place of the LM head), a micro-batch of preference rows (rows
2i, 2i+1: pair i's chosen and rejected sequences), each row's last token,
the pairs' margins and the centring coefficient, and Nekton's results from a
folder; runs the model (tests/model/torch_reference.py's independent one) in
float64, the Bradley-Terry loss written here from its definition (as TRL's
RewardTrainer and Llama 2's margin), its gradient by autograd, and 5 AdamW
steps with global-norm clipping; and exits non-zero if a step's loss or a
final weight differs by more than the tolerance.

  r_b   = score head(final norm(h))[b, last_b]
  loss  = mean_i -log s(r_2i - r_2i+1 - m_i) + center * mean_i (r_2i + r_2i+1)^2

With "regression" in the settings (SteerLM's attribute model, NeMo-Aligner's
regression reward model): one output per attribute, every row its own
record, and the mean squared error over the labelled values (NaN: none):

  loss  = mean over labelled (b, j) of (s_bj - y_bj)^2
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
from torch_reference import Checks, forward  # noqa: E402


def read(path):
    return {k: torch.tensor(v) for k, v in read_numpy(path).items()}


def scores(cfg, P, tokens, last):
    out = forward(cfg, P, tokens)  # [B, T, labels]
    return out[torch.arange(tokens.shape[0]), last]  # [B, labels]


def mse(s, values):
    mask = ~torch.isnan(values)
    return ((s - torch.nan_to_num(values)) ** 2)[mask].mean()


def loss_of(r, margins, center):
    c, j = r[0::2], r[1::2]
    loss = -F.logsigmoid(c - j - margins).mean()
    if center > 0:
        loss = loss + center * ((c + j) ** 2).mean()
    return loss


def main(folder, tol):
    cfg = json.load(open(f"{folder}/model/config.json"))
    s = json.load(open(f"{folder}/settings.json"))
    opt_cfg = json.load(open(f"{folder}/optim.json"))
    batch = read(f"{folder}/batch.safetensors")
    ours = read(f"{folder}/nekton.safetensors")
    tokens, last = batch["tokens"].long(), batch["last"].long()
    regression = s.get("regression", False)
    margins = None if regression else batch["margins"].double()
    values = batch["values"].double() if regression else None
    P0 = {k: v.double() for k, v in read(f"{folder}/model/model.safetensors").items()}
    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    decay = [p for p in P.values() if p.dim() >= 2]
    no_decay = [p for p in P.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opt_cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]), eps=opt_cfg["eps"])
    losses = []
    for _ in range(opt_cfg["steps"]):
        opt.zero_grad()
        out = scores(cfg, P, tokens, last)
        loss = mse(out, values) if regression else loss_of(out[:, 0], margins, s["center"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), opt_cfg["grad_clip"])
        opt.step()
        losses.append(loss.item())
    checks = Checks(tol)
    checks.check("step losses", ours["step_losses"].double(), torch.tensor(losses, dtype=torch.float64))
    print("nekton:", ours["step_losses"].tolist())
    print("torch: ", losses)
    for name, p in P.items():
        checks.check("weight " + name, ours["weight." + name].double(), p.detach())
    checks.exit()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
