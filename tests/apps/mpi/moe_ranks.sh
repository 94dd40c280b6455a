#!/usr/bin/env bash
# `nekton train` of a Mixture-of-Experts model (mixtral-tiny) over several
# processes equals one process: plain data parallelism (2 and 4 ranks),
# ZeRO-1 and FSDP, expert parallelism (EP2 on 2 ranks, EP2 x DP2 on 4, EP2
# with full recompute and with a capacity factor; each rank holding only its
# experts' weights, their gradients summed over the expert-dp group),
# 10 steps in f32 (and packed SFT rows through nekton finetune under EP2), every step's loss and the
# exported weights within 1e-5 (each rank's micro-batch routes its own tokens
# and adds its own load-balancing and z-losses, as one process's
# micro-batches do under gradient accumulation; under EP the experts run on
# their ranks). A checkpoint saved under EP2 resumes on one process and one
# saved on one process resumes under EP2, both to the same 10 steps. ZeRO-1
# under EP2 and EP2 x DP2 (the experts' optimizer state sharded over the
# expert-dp ranks). Pipeline parallelism: PP2, DP2 x PP2, EP2 with PP2 (4
# ranks), PP2 with full recompute, the same losses, weights and MoE figures;
# PP2 and EP2 x PP2 checkpoints resume on one process; the interleaved
# schedule (PP2 VP2, EP2 x PP2 VP2, a PP2 VP2 checkpoint resumed on one
# process) likewise. FSDP under EP2 and EP2 x DP2 (experts sharded over
# expert-dp), resumed on one process. bf16 master weights under EP2 and
# ZeRO-1 EP2 x DP2 against DP2 in bf16 (within 1e-3), an EP2 one resumed
# under EP2 exactly and on one process within 1e-3 too. Refused, naming its key: an expert
# split that does not divide the experts, or a non-MoE model. (Tensor parallelism: moe_tp_ranks.sh.)
# DeepSeek-style routing with aux-loss-free balancing (the expert loads
# summed over the ranks before the bias moves) equals one process too, under
# DP, ZeRO-1, EP2, ZeRO-1 and ZeRO-2 under EP2 x DP2, PP2 and EP2 with PP2 (uneven
# stages, one without MoE layers).
#   tests/apps/mpi/moe_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/moe_lib.sh"
ARGS=("${MIX[@]}")
run one "$NK" train "${ARGS[@]}"
run dp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}"
run dp4 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}"
run zero1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.shard=optimizer
run fsdp "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.shard=full
run ep2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.ep=2
run ep2dp2 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.ep=2
# Saved under EP2 at step 5, resumed on one process; and the other way round.
run ep2to1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.ep=2 train.exit_at_step=5
run ep2to1 "$NK" train "${ARGS[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2to1.log" || fail "ep2to1 did not resume"
run oneto2 "$NK" train "${ARGS[@]}" train.exit_at_step=5
run oneto2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.ep=2
grep -q "resuming from checkpoint" "$WORK/oneto2.log" || fail "oneto2 did not resume"
# Full recompute (each recomputed forward dispatches again) and a capacity
# factor (each rank drops its own pairs before dispatch) under EP2.
run onefull "$NK" train "${ARGS[@]}" train.recompute=full
run ep2full "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" train.recompute=full parallel.ep=2
run onecap "$NK" train "${ARGS[@]}" model.moe_capacity_factor=1.0
run ep2cap "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" model.moe_capacity_factor=1.0 parallel.ep=2
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" onefull ep2full ||
  fail "EP2 with full recompute differs from one process"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" onecap ep2cap ||
  fail "EP2 with a capacity factor differs from one process"
# Packed SFT rows (nekton finetune) under EP2.
/usr/bin/python3 - "$WORK/sft.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        w = "".join(r.choice("abcdefghij") for _ in range(r.randint(1, 12)))
        f.write(json.dumps({"input": "repeat " + w + ":", "output": " " + w * r.randint(1, 3)}) + "\n")
PY
SFT=(model.preset=mixtral-tiny model.vocab_size=264 "data.sft_path=$WORK/sft.jsonl"
     data.chat_template=plain data.pack=true train.seq_len=64 train.lr=3e-3
     "data.sft_valid_path=$WORK/sft.jsonl" train.val_batches=4 train.dtype=f32 train.micro_batch=2
     train.global_batch=8 train.steps=6 train.warmup_steps=0 train.val_every=3 train.peak_tflops=1
     train.threads=1 parallel.timeout_s=60)
run sft1 "$NK" finetune "${SFT[@]}"
run sftep2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" parallel.ep=2
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" sft1 sftep2 ||
  fail "fine-tuning under EP2 differs from one process"
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
grep -q "expert parallel: world 4 = .* ep 2 × edp 2" "$WORK/ep2dp2.log" ||
  fail "ep2dp2 did not run expert parallel: $(grep -m1 parallel "$WORK/ep2dp2.log")"
grep -q '"a2a_ms"' "$WORK/ep2/metrics.jsonl" || fail "ep2 logs no a2a_ms"
# Each rank holds its 2 of the 4 experts of every layer: fewer parameters
# than the whole model's.
/usr/bin/python3 - "$WORK/ep2.log" <<'PY' || fail "ep2 does not hold half the experts: $(grep -m1 'expert parallel' "$WORK/ep2.log")"
import re, sys
m = re.search(r"holds and computes 2 of the 4 experts .*: ([0-9.]+)M of the ([0-9.]+)M parameters",
              open(sys.argv[1]).read())
sys.exit(0 if m and float(m.group(1)) < float(m.group(2)) else 1)
PY
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one dp2 dp4 zero1 fsdp ep2 ep2dp2 \
  ep2to1 oneto2 || fail "a data- or expert-parallel run differs from one process"

# DeepSeek-style routing: sigmoid scores, groups, scaling, the sequence-wise
# balancing loss, a dense first layer and aux-loss-free balancing, whose
# expert loads are summed over the ranks before the bias moves: the same
# biases, losses and weights as one process.
DS=(model.moe_score_func=sigmoid model.num_experts=8 model.moe_n_group=4 model.moe_topk_group=2
    model.moe_routed_scaling=2.5 model.moe_aux_loss_type=seq model.moe_aux_loss_coeff=0.01
    model.moe_first_dense_layers=1 model.n_layer=3 model.moe_bias_update_rate=0.01)
run ds_one "$NK" train "${ARGS[@]}" "${DS[@]}"
run ds_dp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${DS[@]}"
run ds_zero1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.shard=optimizer
run ds_ep2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.ep=2
# Pipelined: the dense first layer and one MoE layer on stage 0, the last MoE
# layer on stage 1; the sequence-wise loss and each stage's biases moved by
# the loads of its own layers.
run ds_pp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.pp=2 parallel.pp_layout=2,1
# Stage 0 only the dense layer (no experts, no frozen bias: the checkpoint's
# gather agrees on the arenas' kind over the stages).
run ds_ep2pp2 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.pp=2 \
  parallel.pp_layout=1,2 parallel.ep=2
run ds_ep2dp2zero1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.ep=2 \
  parallel.shard=optimizer
# ZeRO-2: the experts' gradients reduce-scattered and released over expert-dp.
run ds_ep2dp2zero2 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.ep=2 \
  parallel.shard=grads
grep -q "gradients and optimizer state sharded (ZeRO-2)" "$WORK/ds_ep2dp2zero2.log" ||
  fail "ds_ep2dp2zero2 did not shard the gradients"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" ds_one ds_dp2 ds_zero1 ds_ep2 ds_pp2 \
  ds_ep2pp2 ds_ep2dp2zero1 ds_ep2dp2zero2 ||
  fail "a data-parallel run with DeepSeek routing and bias balancing differs from one process"

# Pipeline parallel (1F1B): each stage routes its own layers' tokens; the
# routing records travel with the activations, so the last stage's loss
# holds every layer's balancing and z-losses and every stage's balancing
# gradient sees every layer's counts. PP2 (2 ranks), EP2 with PP2 (4 ranks:
# each stage's experts split over ep), DP2 with PP2, EP2 x DP2 x PP2 (8
# ranks), EP2 x PP2 with the distributed optimizer (ZeRO-1: each stage's
# dense blocks over its 2 replicas) and with FSDP; the same losses,
# weights and MoE figures (moe_aux, moe_z, moe_load_max) as one process;
# checkpoints of PP2, of EP2 x PP2 and of EP2 x PP2 ZeRO-1 resume on one
# process.
run pp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.pp=2
run ep2pp2 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.pp=2 parallel.ep=2
run dp2pp2 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.pp=2
# 8 ranks: each stage's experts split over ep 2 and summed over edp 2.
run ep2dp2pp2 "${MPI[@]}" 8 "$NK" train "${ARGS[@]}" parallel.pp=2 parallel.ep=2
run pp2full "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.pp=2 train.recompute=full
run pp2to1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.pp=2 train.exit_at_step=5
run pp2to1 "$NK" train "${ARGS[@]}"
grep -q "resuming from checkpoint" "$WORK/pp2to1.log" || fail "pp2to1 did not resume"
run ep2pp2to1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.pp=2 parallel.ep=2 \
  train.exit_at_step=5
run ep2pp2to1 "$NK" train "${ARGS[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2pp2to1.log" || fail "ep2pp2to1 did not resume"
run ep2pp2zero1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.pp=2 parallel.ep=2 \
  parallel.shard=optimizer
grep -q "optimizer state sharded (ZeRO-1)" "$WORK/ep2pp2zero1.log" ||
  fail "ep2pp2zero1 did not shard the optimizer"
run ep2pp2fsdp "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.pp=2 parallel.ep=2 \
  parallel.shard=full
grep -q "optimizer state sharded (FSDP)" "$WORK/ep2pp2fsdp.log" ||
  fail "ep2pp2fsdp did not shard the weights"
run ep2pp2zero1to1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.pp=2 parallel.ep=2 \
  parallel.shard=optimizer train.exit_at_step=5
run ep2pp2zero1to1 "$NK" train "${ARGS[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2pp2zero1to1.log" ||
  fail "ep2pp2zero1to1 did not resume"
grep -q "expert parallel: world 4 = .*pp 2" "$WORK/ep2pp2.log" ||
  fail "ep2pp2 did not run expert parallel: $(grep -m1 parallel "$WORK/ep2pp2.log")"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one pp2 ep2pp2 dp2pp2 ep2dp2pp2 pp2to1 \
  ep2pp2to1 ep2pp2zero1 ep2pp2zero1to1 ep2pp2fsdp ||
  fail "a pipeline-parallel MoE run differs from one process"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" onefull pp2full ||
  fail "PP2 with full recompute differs from one process"
# The MoE figures: the last stage's, over every layer (rank 0 logs them;
# under DP they cover its replica's micro-batches only, so PP2 alone).
/usr/bin/python3 - "$WORK" one pp2 pp2to1 <<'PY' || fail "the pipelined MoE figures differ from one process"
import json, sys
work, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
rec = lambda r: [json.loads(l) for l in open(f"{work}/{r}/metrics.jsonl")]
want = rec(ref)
for run in runs:
    for a, b in zip(rec(run), want):
        for k in ("moe_aux", "moe_z", "moe_load_max", "moe_load_max.l1"):
            assert k in a and abs(a[k] - b[k]) <= 1e-5 * max(1, abs(b[k])), (run, a["step"], k, a.get(k), b[k])
PY

# The interleaved schedule (parallel.vp=2; 4 layers in 4 chunks, each rank
# two): the routing records pass every chunk with the residual stream, their
# receives posted at the step's start. PP2 VP2, EP2 x PP2 VP2 (4 ranks), a
# PP2 VP2 checkpoint resumed on one process; the same losses, weights and
# MoE figures as one process.
L4=(model.n_layer=4)
run one4 "$NK" train "${ARGS[@]}" "${L4[@]}"
run pp2vp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${L4[@]}" parallel.pp=2 parallel.vp=2
run ep2pp2vp2 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" "${L4[@]}" parallel.pp=2 parallel.vp=2 \
  parallel.ep=2
run pp2vp2to1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${L4[@]}" parallel.pp=2 parallel.vp=2 \
  train.exit_at_step=5
run pp2vp2to1 "$NK" train "${ARGS[@]}" "${L4[@]}"
grep -q "resuming from checkpoint" "$WORK/pp2vp2to1.log" || fail "pp2vp2to1 did not resume"
grep -q "interleaved 1F1B" "$WORK/pp2vp2.log" ||
  fail "pp2vp2 did not run the interleaved schedule: $(grep -m1 parallel "$WORK/pp2vp2.log")"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one4 pp2vp2 ep2pp2vp2 pp2vp2to1 ||
  fail "an interleaved pipeline-parallel MoE run differs from one process"
/usr/bin/python3 - "$WORK" one4 pp2vp2 <<'PY' || fail "the interleaved MoE figures differ from one process"
import json, sys
work, ref, run = sys.argv[1:]
rec = lambda r: [json.loads(l) for l in open(f"{work}/{r}/metrics.jsonl")]
for a, b in zip(rec(run), rec(ref)):
    for k in ("moe_aux", "moe_z", "moe_load_max", "moe_load_max.l3"):
        assert k in a and abs(a[k] - b[k]) <= 1e-5 * max(1, abs(b[k])), (run, a["step"], k, a.get(k), b[k])
PY

# bf16 master weights (optim.master_dtype=bf16, bf16 compute) under EP2,
# and ZeRO-1 and FSDP under EP2 x DP2: every step's loss within 1e-3 (relative) of DP2's
# in bf16 (the tolerance of the bf16 data-parallel checks,
# tests/parallel/mpi/ddp_equivalence_mpi.cc; the expert all-to-all only moves
# rows); an EP2 checkpoint resumed under EP2 repeats EP2's steps 6-10
# exactly (the masters lent as f32 to the save and joined back), and resumed
# on one process within the bf16 layouts' 1e-3 of DP2 like the others: one
# process sums the four micro-batches' bf16-computed gradients in another
# order than EP2's all-reduce, so its f32 masters move by a few ulps, which
# the bf16 weights show once a rounding boundary is crossed (measured
# against EP2's steps: equal to step 8, 1.8e-7 at step 9, 1.8e-5 at 10).
BF=(train.dtype=bf16 optim.master_dtype=bf16)
run bfdp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${BF[@]}"
run bfep2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${BF[@]}" parallel.ep=2
run bfep2zero1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" "${BF[@]}" parallel.ep=2 \
  parallel.shard=optimizer
run bfep2fsdp "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" "${BF[@]}" parallel.ep=2 \
  parallel.shard=full
grep -q "sharded (FSDP)" "$WORK/bfep2fsdp.log" || fail "bfep2fsdp did not run FSDP"
run bfep2to2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${BF[@]}" parallel.ep=2 train.exit_at_step=5
run bfep2to2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${BF[@]}" parallel.ep=2
grep -q "resuming from checkpoint" "$WORK/bfep2to2.log" || fail "bfep2to2 did not resume"
run bfep2to1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${BF[@]}" parallel.ep=2 train.exit_at_step=5
run bfep2to1 "$NK" train "${ARGS[@]}" "${BF[@]}"
grep -q "resuming from checkpoint" "$WORK/bfep2to1.log" || fail "bfep2to1 did not resume"
/usr/bin/python3 - "$WORK" <<'PY' || fail "bf16 masters under expert parallelism differ"
import json, sys
work = sys.argv[1]
rec = lambda r: {x["step"]: x["loss"] for x in map(json.loads, open(f"{work}/{r}/metrics.jsonl"))}
ref, ep = rec("bfdp2"), rec("bfep2")
assert sorted(ref) == list(range(1, 11)), sorted(ref)
for run in ("bfep2", "bfep2zero1", "bfep2fsdp", "bfep2to1"):
    got = rec(run)
    assert sorted(got) == sorted(ref), (run, sorted(got))
    for s in ref:
        assert abs(got[s] - ref[s]) <= 1e-3 * abs(ref[s]), (run, s, got[s], ref[s])
for s in range(6, 11):
    assert rec("bfep2to2")[s] == ep[s], ("bfep2to2", s, rec("bfep2to2")[s], ep[s])
print("bf16 masters: EP2, ZeRO-1 and FSDP EP2xDP2 and an EP2 checkpoint resumed on one process agree; resumed under EP2 exactly")
PY

refuse() {
  local out=$1 pattern=$2
  shift 2
  if "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1; then fail "$out was not refused"; fi
  grep -qF -- "$pattern" "$WORK/$out.log" || fail "$out: no '$pattern': $(tail -3 "$WORK/$out.log")"
}
refuse ep4 "parallel.ep = 4: model.num_experts = 3 does not split into equal counts" \
  "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" model.num_experts=3 parallel.ep=4
# ZeRO-1 under EP: the experts' optimizer state sharded over the expert-dp
# ranks, the rest over dp. EP2 (2 ranks: experts unsharded, the rest over 2)
# and EP2 x DP2 (4 ranks: each expert's state over 2), the same as one
# process; a checkpoint of EP2 x DP2 with ZeRO-1 resumes on one process.
run ep2zero1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.ep=2 parallel.shard=optimizer
run ep2dp2zero1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.ep=2 parallel.shard=optimizer
run ep2dp2zero1to1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.ep=2 parallel.shard=optimizer \
  train.exit_at_step=5
run ep2dp2zero1to1 "$NK" train "${ARGS[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2dp2zero1to1.log" || fail "ep2dp2zero1to1 did not resume"
grep -q "optimizer state sharded (ZeRO-1)" "$WORK/ep2dp2zero1.log" || fail "ep2dp2zero1 is not ZeRO-1"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one ep2zero1 ep2dp2zero1 \
  ep2dp2zero1to1 || fail "ZeRO-1 under expert parallelism differs from one process"
# FSDP under expert parallelism: each expert tensor's weights, gradients
# and optimizer state sharded over its expert-dp ranks (EP2 on 2 ranks: edp
# 1, whole; EP2 x DP2 on 4: over 2), the rest over dp; an EP2 x DP2 FSDP
# checkpoint resumed on one process.
run ep2fsdp "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.ep=2 parallel.shard=full
run ep2dp2fsdp "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.ep=2 parallel.shard=full
run ep2dp2fsdpto1 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}" parallel.ep=2 parallel.shard=full \
  train.exit_at_step=5
run ep2dp2fsdpto1 "$NK" train "${ARGS[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2dp2fsdpto1.log" || fail "ep2dp2fsdpto1 did not resume"
grep -q "sharded (FSDP)" "$WORK/ep2dp2fsdp.log" ||
  fail "ep2dp2fsdp did not run FSDP: $(grep -m1 "data parallel" "$WORK/ep2dp2fsdp.log")"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one ep2fsdp ep2dp2fsdp \
  ep2dp2fsdpto1 || fail "FSDP under expert parallelism differs from one process"
refuse dense_ep "parallel.ep = 2: the model has no experts" \
  "${MPI[@]}" 2 "$NK" train model.preset=llama-tiny "data.path=$WORK/c.txt" train.micro_batch=2 \
  train.seq_len=16 train.global_batch=8 train.steps=1 parallel.ep=2
pass "MoE training under DP (2, 4 ranks), ZeRO-1, FSDP, EP2, EP2xDP2 (experts split over ep), EP2 with full recompute/capacity factor, ZeRO-1 under EP2 and EP2xDP2, PP2, DP2xPP2, EP2 with PP2 (and x DP2 on 8 ranks), the interleaved schedule (PP2 VP2, EP2 x PP2 VP2) and EP2 fine-tuning equal one process (DeepSeek routing with aux-loss-free balancing under DP, ZeRO-1, EP2, PP2 and EP2xPP2 too); EP2, PP2, EP2xPP2 and ZeRO-1 EP2xDP2 checkpoints resume on one process; FSDP under EP2 and EP2xDP2 equals one process and resumes on one; bf16 masters under EP2 and ZeRO-1 and FSDP EP2xDP2 agree with DP2 and resume"
