#!/usr/bin/env bash
# `nekton align` under data parallelism equals one process (issue 37, item
# 8): DPO with the precomputed reference over 2 and 4 ranks, ZeRO-1, ZeRO-2,
# FSDP, TP2, DP2xTP2 (ZeRO-1, ZeRO-2 and FSDP);
# a frozen-copy reference, KTO and SimPO over 2 ranks; a reward model under
# ZeRO-1, FSDP, TP2, DP2xTP2, TP2 SP and DP2xTP2 SP, and from a fine-tuned
# LM under TP2 and PP2. Every step's loss,
# validation loss and TRL figures (rewards/*, logps/*, kl: global means over
# the ranks' pairs) and the exported weights within 1e-5 of one process (f32),
# 10 steps; the reference_logps.json every layout writes is the same bytes.
# Tensor parallelism (alone and under data parallelism) too, within 1e-5.
# Pipeline parallelism (the last stage runs the objective's head): PP2,
# PP2xDP2 (plain, ZeRO-1, FSDP), PP2xTP2 and interleaved PP2 (vp 2) DPO, a
# copy reference, KTO and a reward model, within 1e-5; the reference
# precomputed through the stages (and FSDP's shards) is the same bytes as one
# process's. Sequence parallelism (the head gathers every row): TP2 SP,
# DP2xTP2 SP FSDP, PP2xTP2 SP and KTO under TP2 SP, within 1e-5. Context
# parallelism (each row's sums over the cp ranks' chunks): CP2 with p2p, a2a
# and all_gather, CP2xDP2 FSDP, CP2xTP2, KTO, SimPO and a reward model
# (CP2, CP2xDP2 ZeRO-1 a2a, CP2xTP2), an attribute model under CP2 and TP2
# SP, a copy reference under CP2 and CP2xDP2 FSDP; DPO (precomputed and copy
# references) and a reward model under CP2xPP2; within 1e-5. (Expert
# parallelism: moe_align_ranks.sh.)
#   tests/apps/mpi/align_ranks.sh REPO BUILD
set -euo pipefail
NAME=align_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"
ARGS=("${ALIGN_ARGS[@]}")
run one "$NK" align "${ARGS[@]}"
run dp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}"
run dp4 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}"
run nproc2 "$NK" align --nproc 2 "${ARGS[@]}"
run zero1 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=optimizer
run fsdp "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=full
run zero2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=grads
run tp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.tp=2
run dp2tp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.tp=2 parallel.shard=optimizer
run dp2tp2fsdp "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.tp=2 parallel.shard=full
run dp2tp2zero2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.tp=2 parallel.shard=grads
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
compare one dp2 dp4 nproc2 zero1 fsdp zero2 tp2 dp2tp2 dp2tp2fsdp dp2tp2zero2 ||
  fail "a parallel DPO run differs from one process"
for r in dp2 dp4 zero1 fsdp; do
  cmp -s "$WORK/one/reference_logps.json" "$WORK/$r/reference_logps.json" ||
    fail "$r: reference_logps.json differs from one process's"
done

run one_copy "$NK" align "${ARGS[@]}" align.reference=copy
run dp2_copy "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.reference=copy parallel.shard=full
run one_kto "$NK" align "${ARGS[@]}" align.method=kto align.data_path=$WORK/kto.jsonl \
  align.valid_path=
run dp2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=kto \
  align.data_path=$WORK/kto.jsonl align.valid_path= parallel.shard=optimizer
run tp2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=kto \
  align.data_path=$WORK/kto.jsonl align.valid_path= parallel.tp=2
run one_simpo "$NK" align "${ARGS[@]}" align.method=simpo
run dp2_simpo "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=simpo
compare one_copy dp2_copy &&
  compare one_kto dp2_kto tp2_kto &&
  compare one_simpo dp2_simpo ||
  fail "copy reference, KTO or SimPO: data parallel differs from one process"

# A reward model (a score head, Bradley-Terry): its staged form under ZeRO-1
# and FSDP; under tensor parallelism its score head whole on every rank.
run one_rm "$NK" align "${ARGS[@]}" align.method=rm
run dp2_rm "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rm parallel.shard=optimizer
run fsdp_rm "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rm parallel.shard=full
run tp2_rm "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rm parallel.tp=2
run dp2tp2_rm "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" align.method=rm parallel.tp=2 \
  parallel.shard=optimizer
# Under sequence parallelism the final norm's rows are gathered and every
# rank scores every row alike, keeping its own rows' gradient.
run tp2sp_rm "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rm parallel.tp=2 parallel.sp=true
run dp2tp2sp_rm "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" align.method=rm parallel.tp=2 \
  parallel.sp=true parallel.shard=optimizer
compare one_rm dp2_rm fsdp_rm tp2_rm dp2tp2_rm tp2sp_rm dp2tp2sp_rm ||
  fail "reward model: data, tensor or sequence parallel differs from one process"
# From a fine-tuned causal LM, as reward models are made: the score head the
# run adds is drawn from the seed as on one process, under TP2 and PP2 too.
run base "$NK" finetune "${SFT_ARGS[@]}" train.steps=3
RM=(align.method=rm train.init_from="$WORK/base/model")
run one_rm_base "$NK" align "${ARGS[@]}" "${RM[@]}"
run tp2_rm_base "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${RM[@]}" parallel.tp=2
run pp2_rm_base "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${RM[@]}" parallel.pp=2
compare one_rm_base tp2_rm_base pp2_rm_base ||
  fail "reward model from a fine-tuned LM: TP2 or PP2 differs from one process"

# Pipeline parallel: the last stage's head; the figures reach rank 0 from it.
run pp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.pp=2
run pp2dp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.pp=2
run pp2zero1 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.pp=2 parallel.shard=optimizer
run pp2fsdp "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.pp=2 parallel.shard=full
run pp2tp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.pp=2 parallel.tp=2
grep -q "pipeline stage 0 of 2" "$WORK/pp2.log" || fail "pp2 did not run a pipeline"
compare one pp2 pp2dp2 pp2zero1 pp2fsdp pp2tp2 || fail "a pipelined DPO run differs from one process"
# The reference through the model's pieces (no rank builds the whole model):
# the same sums as one process's but under tensor parallelism.
for r in fsdp pp2 pp2dp2 pp2zero1 pp2fsdp pp2tp2; do
  grep -q "through the model's pieces on the ranks" "$WORK/$r.log" ||
    fail "$r: the reference was not computed through the model's pieces"
done
for r in pp2 pp2dp2 pp2zero1 pp2fsdp; do
  cmp -s "$WORK/one/reference_logps.json" "$WORK/$r/reference_logps.json" ||
    fail "$r: reference_logps.json differs from one process's"
done
run one4 "$NK" align "${ARGS[@]}" model.n_layer=4
run pp2vp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" model.n_layer=4 parallel.pp=2 parallel.vp=2
run pp2_copy "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.reference=copy parallel.pp=2
run pp2_kto "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" align.method=kto \
  align.data_path="$WORK/kto.jsonl" align.valid_path= parallel.pp=2
run pp2_rm "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" align.method=rm parallel.pp=2 \
  parallel.shard=optimizer
compare one4 pp2vp2 || fail "interleaved PP2 DPO differs from one process"
compare one_copy pp2_copy || fail "copy reference: PP2 differs from one process"
compare one_kto pp2_kto || fail "KTO: PP2xDP2 differs from one process"
compare one_rm pp2_rm || fail "reward model: PP2xDP2 ZeRO-1 differs from one process"

# Sequence parallel: the head's rows gathered, whole rows' sums on every rank.
SP=(parallel.tp=2 parallel.sp=true)
run tp2sp "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${SP[@]}"
run dp2tp2sp "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" "${SP[@]}" parallel.shard=full
run pp2tp2sp "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" "${SP[@]}" parallel.pp=2
run tp2sp_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${SP[@]}" align.method=kto \
  align.data_path="$WORK/kto.jsonl" align.valid_path=
compare one tp2sp dp2tp2sp pp2tp2sp || fail "DPO under sequence parallelism differs from one process"
compare one_kto tp2sp_kto || fail "KTO under TP2 SP differs from one process"

# Context parallel: each rank's chunks of the rows, the rows' sums over the
# cp ranks; the reference through the chunks.
run cp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.cp=2
run cp2a2a "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.cp_comm_type=a2a
run cp2ag "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.cp_comm_type=all_gather
run cp2dp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.shard=full
run cp2tp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.tp=2
run cp2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=kto \
  align.data_path="$WORK/kto.jsonl" align.valid_path= parallel.cp=2
run cp2_simpo "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" align.method=simpo parallel.cp=2
grep -q "through the model's pieces on the ranks" "$WORK/cp2.log" ||
  fail "cp2: the reference was not computed through the cp ranks' chunks"
compare one cp2 cp2a2a cp2ag cp2dp2 cp2tp2 || fail "DPO under context parallelism differs from one process"
compare one_kto cp2_kto || fail "KTO under CP2 differs from one process"
compare one_simpo cp2_simpo || fail "SimPO under CP2 x DP2 differs from one process"

# The reference computed by the split model itself (its own sums): the first
# step's policy is the reference bit for bit, its rewards exactly 0, under
# every layout (with FSDP x TP it used to be the whole initial model's sums).
/usr/bin/python3 - "$WORK" one tp2 dp2tp2fsdp fsdp pp2tp2 pp2fsdp tp2sp cp2 cp2tp2 cp2dp2 <<'PY' ||
import json, sys
for run in sys.argv[2:]:
    with open(f"{sys.argv[1]}/{run}/metrics.jsonl") as f:
        first = next(r for r in map(json.loads, f) if r.get("step") == 1 and "rewards/chosen" in r)
    for k in ("rewards/chosen", "rewards/rejected"):
        assert first[k] == 0.0, f"{run}: step 1 {k} = {first[k]}, not 0"
PY
  fail "a layout's first-step rewards are not 0: its reference is not its own forward"

# A frozen-copy reference under context parallelism: the copy forwards the
# whole rows on every cp rank.
run cp2_copy "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.cp=2 align.reference=copy
run cp2dp2_copy "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 align.reference=copy \
  parallel.shard=full
compare one_copy cp2_copy cp2dp2_copy || fail "a copy reference under CP2 differs from one process"
# A reward model under context parallelism: the rank whose chunks hold a
# row's last token scores it, the cp ranks sum the scores. (AdamW's eps is
# 1e-6 here: a reward model's gradient comes from one position a row, and
# elements where it nearly cancels take eps 1e-8's updates of up to lr from
# rounding-level remainders; after one step CP2 and TP2 alike were 6-7e-6
# apart from one process at eps 1e-8, 0.9-1.7e-6 at 1e-6.)
RM_CP=("${ARGS[@]}" align.method=rm train.eps=1e-6)
run one_rm_eps "$NK" align "${RM_CP[@]}"
run cp2_rm "${MPI[@]}" 2 "$NK" align "${RM_CP[@]}" parallel.cp=2
run cp2dp2_rm "${MPI[@]}" 4 "$NK" align "${RM_CP[@]}" parallel.cp=2 parallel.shard=optimizer \
  parallel.cp_comm_type=a2a
run cp2tp2_rm "${MPI[@]}" 4 "$NK" align "${RM_CP[@]}" parallel.cp=2 parallel.tp=2
compare one_rm_eps cp2_rm cp2dp2_rm cp2tp2_rm ||
  fail "reward model: context parallel differs from one process"
# An attribute model (SteerLM's regression, two outputs, a missing label out
# of the loss) under CP2 and TP2 SP alike.
/usr/bin/python3 - "$WORK/attributes.jsonl" <<'PY'
import json, random, sys
r = random.Random(3)
with open(sys.argv[1], "w") as f:
    for i in range(32):
        w = "".join(r.choice("abcdef") for _ in range(r.randint(2, 9))) + "!" * r.randint(0, 3)
        f.write(json.dumps({"prompt": "rate:", "response": w, "helpfulness": w.count("!"),
                            "verbosity": None if i % 5 == 0 else len(w) / 4}) + "\n")
PY
ATTR=("${RM_CP[@]}" align.reward_model_type=regression align.steerlm_attributes=helpfulness,verbosity
      "align.data_path=$WORK/attributes.jsonl" "align.valid_path=$WORK/attributes.jsonl")
run one_attr "$NK" align "${ATTR[@]}"
run cp2_attr "${MPI[@]}" 2 "$NK" align "${ATTR[@]}" parallel.cp=2
run tp2sp_attr "${MPI[@]}" 2 "$NK" align "${ATTR[@]}" parallel.tp=2 parallel.sp=true
compare one_attr cp2_attr tp2sp_attr ||
  fail "an attribute model under CP2 or TP2 SP differs from one process"
# Context parallelism with a pipeline: the last stage's cp ranks sum each
# row's parts; the reference is computed by the stages in turn over each cp
# rank's chunks (precomputed), or by a whole copy on every rank.
run cp2pp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.pp=2
run cp2pp2_copy "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.pp=2 \
  align.reference=copy
run cp2pp2_rm "${MPI[@]}" 4 "$NK" align "${RM_CP[@]}" parallel.cp=2 parallel.pp=2
compare one cp2pp2 && compare one_copy cp2pp2_copy && compare one_rm_eps cp2pp2_rm ||
  fail "DPO (precomputed or copy reference) or a reward model under CP2 x PP2 differs from one process"
pass "align (DPO, copy reference, KTO, SimPO, reward model) under DP (2, 4 ranks), ZeRO-1, FSDP, TP2, DP2xTP2, PP2 (with DP2, ZeRO-1, FSDP, TP2, interleaved), SP and CP2 (with DP2, TP2, PP2) equals one process"
