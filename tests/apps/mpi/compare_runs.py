# Compares runs of the tests/apps/mpi scripts with a one-process run:
#   compare_runs.py [--loss-tol X] [--trained-tol Y] [--tensor-norm | --bf16-base] WORK REF RUN...
# Each RUN's metrics.jsonl losses (and figures, when logged) must equal the
# reference's at every step within 1e-5 (relative; absolute below 1), and its exported
# OUT/model/model.safetensors every tensor within 1e-5 (absolute, f32); so
# must its PEFT adapter OUT/adapter/adapter_model.safetensors where the
# reference has one (and the model only where the reference has one: QLoRA
# exports its adapter alone), and PPO's critic OUT/critic/model where the
# reference has one.
# --tensor-norm: the weights per tensor instead, ||run - ref|| / ||ref|| <=
# 1e-4 (2-norm), for layouts that add attention's terms in another order
# (context parallelism's ring merges each block through the log-sum-exp).
# --bf16-base: adapters trained in bf16 compute over a frozen base held in
# bf16: the losses within 1e-4 (relative), the base's tensors (those the
# reference's model stores as BF16) bit for bit, the rest per tensor within
# 1e-2 (2-norm; bf16 products rounded in another grouping).
# --loss-tol X, --trained-tol Y (first, in that order): the losses within X
# (relative), and with --bf16-base the trained tensors within Y, instead:
# bf16 compute under tensor parallelism, whose row-parallel layers round
# each rank's partial product to bf16 before the group adds them.
# Adam divides each gradient element by its own running magnitude, so the
# few elements whose contributions nearly cancel carry that rounding into
# whole steps of size lr; at lr 1e-2 a handful of elements in thousands
# move by 1e-5 to 3e-5 while the tensors agree within 2e-5 and every loss
# within 1e-7 (tests/parallel/mpi/equivalence_util.h says the same).
import json
import os
import struct
import sys

import numpy as np


def records(run):
    return {r["step"]: r for r in map(json.loads, open(f"{run}/metrics.jsonl"))}


def weights(path, bf16=None):
    """The tensors of a safetensors file as f32; bf16: a set given the names stored as BF16."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] in ("F32", "BF16"), (path, name, t["dtype"])
        b, e = t["data_offsets"]
        if t["dtype"] == "F32":
            out[name] = np.frombuffer(data[b:e], dtype=np.float32)
        else:
            bits = np.frombuffer(data[b:e], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = bits.view(np.float32)
            if bf16 is not None:
                bf16.add(name)
    return out


args = sys.argv[1:]
loss_tol, trained_tol = None, 1e-2
if args[0] == "--loss-tol":
    loss_tol, args = float(args[1]), args[2:]
if args[0] == "--trained-tol":
    trained_tol, args = float(args[1]), args[2:]
tensor_norm = args[0] == "--tensor-norm"
bf16_base = args[0] == "--bf16-base"
if tensor_norm or bf16_base:
    args = args[1:]
LOSS_TOL = loss_tol or (1e-4 if bf16_base else 1e-5)
work, ref, runs = args[0], args[1], args[2:]
want = records(f"{work}/{ref}")
FILES = [f for f in ("model/model.safetensors", "adapter/adapter_model.safetensors",
                     "critic/model/model.safetensors")
         if os.path.exists(f"{work}/{ref}/{f}")]
assert FILES, f"{ref}: neither a model nor an adapter was exported"
base = {f: set() for f in FILES}  # the reference's tensors stored as BF16, per file
want_w = {f: weights(f"{work}/{ref}/{f}", base[f]) for f in FILES}
keys = sorted({k for r in want.values() for k in r
               if k.removeprefix("val_") in ("loss", "kl", "nll_loss") or "/" in k})
for run in runs:
    got = records(f"{work}/{run}")
    assert sorted(got) == sorted(want), (run, sorted(got), sorted(want))
    worst_rel = 0.0
    for s in sorted(want):
        for k in keys:
            a, b = got[s].get(k), want[s].get(k)
            if b is None or b != b:  # not logged at this step (NaN)
                assert a is None or a != a, f"{run} step {s} {k}: {a}, one process none"
                continue
            # A preference accuracy counts rewards/chosen > rewards/rejected:
            # where one process's rewards are all zero (the first step, the
            # policy still the reference) each pair ties and the accuracy is
            # decided by rounding (a layout whose reference is computed
            # with another grouping of the sums than its policy's): not
            # compared; the rewards themselves are.
            if k.removeprefix("val_") == "rewards/accuracies" and all(
                    abs(want[s].get(k.replace("accuracies", w)) or 0.0) <= LOSS_TOL
                    for w in ("chosen", "rejected")):
                continue
            # Relative, or absolute below 1: the rewards are beta times a
            # difference of log-probabilities some 100 times larger.
            rel = abs(a - b) / max(abs(b), 1.0)
            assert rel <= LOSS_TOL, \
                f"{run} step {s} {k}: {a} vs one process {b} (relative {rel:.2e})"
            worst_rel = max(worst_rel, rel)
    worst = {}
    for file, w in want_w.items():
        got_w = weights(f"{work}/{run}/{file}")
        assert sorted(got_w) == sorted(w), (run, file, sorted(set(got_w) ^ set(w)))
        if bf16_base:
            for n in base[file]:
                assert np.array_equal(got_w[n], w[n]), f"{run}: {file}: base tensor {n} moved"
            trained = [n for n in w if n not in base[file]]
            worst[file] = max((float(np.linalg.norm(got_w[n] - w[n]) /
                                     max(np.linalg.norm(w[n]), 1e-30)) for n in trained),
                              default=0.0)
            assert worst[file] <= trained_tol, \
                f"{run}: {file} differs from one process by {worst[file]:.2e} (a tensor's 2-norm)"
        elif tensor_norm:
            worst[file] = max(float(np.linalg.norm(got_w[n] - w[n]) /
                                    max(np.linalg.norm(w[n]), 1e-30)) for n in w)
            assert worst[file] <= 1e-4, \
                f"{run}: {file} differs from one process by {worst[file]:.2e} (a tensor's 2-norm)"
        else:
            worst[file] = max(float(np.max(np.abs(got_w[n] - w[n]))) for n in w)
            assert worst[file] <= 1e-5, \
                f"{run}: {file} differs from one process by {worst[file]:.2e}"
    how = " (relative, per tensor)" if tensor_norm or bf16_base else ""
    within = ", ".join(f"{f.split('/')[0]} within {d:.1e}{how}" for f, d in worst.items())
    if bf16_base:
        within += ", the bf16 base bit for bit"
    print(f"{run}: {len(want)} steps ({', '.join(keys)}) within {worst_rel:.1e}, {within}")
