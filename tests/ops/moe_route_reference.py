"""DeepSeek-V3's router in float64 PyTorch, written from the paper's equations
(arXiv:2412.19437, section 2.1.2) and Hugging Face's DeepseekV3MoE: scores
s = sigmoid(logits) (or softmax), choice scores s + b (b: the expert bias),
n_group groups scored by the sum of their two largest choice scores, the
topk_group best groups kept, the top k experts among theirs; weights the
unbiased scores of the chosen, normalised (norm_topk) and scaled. Also the
balancing statistics per segment of rows (sum of s / sum(s) per expert, of
logsumexp(logits)^2).

Usage: moe_route_reference.py IN.json OUT.json
"""
import json
import sys

import torch


def route(c):
    logits = torch.tensor(c["logits"], dtype=torch.float64).view(c["N"], c["E"])
    N, E, k = c["N"], c["E"], c["k"]
    G, TG, S = c["n_group"], c["topk_group"], c["segments"]
    bias = torch.tensor(c["bias"], dtype=torch.float64) if c["bias"] else torch.zeros(E, dtype=torch.float64)
    scores = logits.sigmoid() if c["sigmoid"] else logits.softmax(-1)
    choice = scores + bias
    grouped = choice.view(N, G, E // G)
    group_scores = grouped.topk(min(2, E // G), dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(TG, dim=-1)[1]
    group_mask = torch.zeros(N, G, dtype=torch.bool)
    group_mask.scatter_(1, group_idx, True)
    expert_mask = group_mask.unsqueeze(-1).expand(N, G, E // G).reshape(N, E)
    masked = choice.masked_fill(~expert_mask, float("-inf"))
    idx = masked.topk(k, dim=-1, sorted=True)[1]
    w = scores.gather(1, idx)
    if c["norm_topk"]:
        w = w / w.sum(-1, keepdim=True)
    w = w * c["scaling"]
    bal = scores / scores.sum(-1, keepdim=True) if c["sigmoid"] else scores
    lse2 = torch.logsumexp(logits, -1) ** 2
    stats = torch.cat([bal, lse2.unsqueeze(-1)], -1).view(S, N // S, E + 1).sum(1)
    return {
        "probs": scores.flatten().tolist(),
        "idx": idx.flatten().tolist(),
        "weights": w.flatten().tolist(),
        "stats": stats.flatten().tolist(),
    }


def main():
    cases = json.load(open(sys.argv[1]))
    json.dump([route(c) for c in cases], open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
