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
from torch_reference import forward, objective_parity  # noqa: E402


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
    s = json.load(open(f"{folder}/settings.json"))
    batch = read(f"{folder}/batch.safetensors")
    tokens, last = batch["tokens"].long(), batch["last"].long()
    regression = s.get("regression", False)

    def make_loss(cfg, _):
        def loss_fn(P):
            out = scores(cfg, P, tokens, last)
            if regression:
                return mse(out, batch["values"].double())
            return loss_of(out[:, 0], batch["margins"].double(), s["center"])
        return loss_fn

    objective_parity(folder, tol, make_loss)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
