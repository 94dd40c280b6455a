#!/usr/bin/env bash
# One LoRA fine-tuning step on the Llama 3.2 1B shape (Nekton's llama-1b: 16
# layers, hidden 2048, 32 heads / 8 kv heads, MLP 8192, vocabulary 128256, tied
# embeddings, RoPE theta 500000), Nekton against PyTorch 1.13
# (bench/torch_lora_bench.py) side by side in one session: batch 1 x seq_len,
# LoRA r=16, alpha=32 on q,k,v,o,gate,up,down (all-linear), bf16 compute (see
# TORCH_DTYPE), random frozen base, AdamW over the adapters only.
#
# Nekton runs `nekton train` (the trainer `nekton finetune` uses) with
# peft.method=lora on a random base: there is no saved 1B model to init_from.
# Optionally (third argument > 0) a full-SFT pair on a smaller shape that fits
# in memory: llama-1b cut to that many layers (same width and vocabulary).
#
# Usage: bash bench/run_lora_bench.sh [steps=4] [seq_len=512 (tiny: 128)] [full_layers=0]
#   steps        Nekton optimizer steps; the mean is over the steps after the
#                first two (one when steps < 3). PyTorch runs 1 warm-up step
#                and then the same number of timed steps.
#   full_layers  > 0: also the full-SFT rows, llama-1b with this many layers
#                (4 layers: 0.5B parameters; ~9 GiB tensors, ~12 GiB RSS in Nekton).
# Environment:
#   SHAPE=tiny   smoke test: Nekton's llama-tiny and `--shape tiny` (seq_len
#                at most 256, default 128) instead of llama-1b; seconds
#                instead of minutes:  SHAPE=tiny bash bench/run_lora_bench.sh 4 128 2
#   LAYERS=N     override the layer count of the LoRA rows (quick checks)
#   THREADS=2    threads for both frameworks (default 2)
#   NK_DTYPE=bf16  Nekton's train.dtype (bf16 or f32)
#   METHODS="lora"  Nekton's adapter rows, any of lora, qlora (LoRA over the
#                base in NF4), ia3 (PEFT's default targets), adapter (NeMo's
#                bottleneck adapters, width 32, on linear_proj and
#                linear_fc2); p-tuning reads conversations, not this script's
#                text, so it has no row here; the PyTorch
#                LoRA row is the reference of each (its ratio column)
#   NO_TORCH=1   skip the PyTorch rows (Nekton's alone)
#   TORCH_DTYPE=auto  PyTorch's compute: bf16 (autocast, frozen base stored in
#                bf16), fp32 (no autocast, base in fp32), or auto: bf16 when
#                this PyTorch multiplies bf16 at least half as fast as fp32,
#                else fp32 with a warning. Debian's PyTorch 1.13 has a fast
#                bf16 product only on AVX-512 CPUs; on an AVX2-only CPU it
#                falls back to ~1-5 GFLOP/s, and one 1B bf16 step would take
#                tens of minutes.
#   KEEP_SAVE=1  let Nekton write its end-of-run checkpoint and model (about
#                10 GB for 1B); by default the script kills the nekton process
#                it started once metrics.jsonl holds every step, since the
#                saves come after the last timed step and add nothing here
#   OBJECTIVE=dpo  the step of `nekton align align.method=dpo` instead of the
#                LM loss, on both sides: micro-batches of one pair (2 rows of
#                seq_len: a prompt of seq_len/2 - 1 random letters, completions
#                of seq_len/2 - 1 letters and the end-of-document token), beta
#                0.1; the reference of the LoRA rows is the base with the
#                adapters off (a no-grad forward in every step), that of the
#                full rows precomputed once before the first step (Nekton's
#                align.reference=precompute, logged apart from the steps)
#   NEKTON=path  binary (default build/bin/nekton)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4}
FULL_LAYERS=${3:-0}
SHAPE=${SHAPE:-1b}
SEQ=${2:-$([[ $SHAPE == tiny ]] && echo 128 || echo 512)}
THREADS=${THREADS:-2}
LAYERS=${LAYERS:-0}
NK_DTYPE=${NK_DTYPE:-bf16}
TORCH_DTYPE=${TORCH_DTYPE:-auto}
METHODS=${METHODS:-lora}
NO_TORCH=${NO_TORCH:-0}
OBJECTIVE=${OBJECTIVE:-lm}
BIN=${NEKTON:-./build/bin/nekton}
PY=/usr/bin/python3
RANK=16
ALPHA=32

case "$SHAPE" in
  1b) PRESET=llama-1b ;;
  tiny) PRESET=llama-tiny ;;
  *) echo "SHAPE must be 1b or tiny, not '$SHAPE'" >&2; exit 2 ;;
esac
if (( STEPS < 1 )); then echo "steps must be >= 1" >&2; exit 2; fi
SKIP=$(( STEPS >= 3 ? 2 : STEPS - 1 ))   # Nekton warm-up steps left out of the mean
PT_STEPS=$(( STEPS - SKIP ))

# Another session may be rebuilding the tree: wait for the binary (5 minutes at most).
for _ in $(seq 60); do [[ -x $BIN ]] && break; echo "waiting for $BIN ..." >&2; sleep 5; done
[[ -x $BIN ]] || { echo "no $BIN" >&2; exit 1; }

out=$(mktemp -d)
nk_pid=
cleanup() {
  if [[ -n $nk_pid ]]; then kill -KILL "$nk_pid" 2>/dev/null || true; fi
  rm -rf "$out"
}
trap cleanup EXIT
results=$out/results.tsv
: >"$results"

# The command each Nekton run starts with, and PyTorch's matching options.
case $OBJECTIVE in
  lm) nk_cmd=(train data.path=README.md train.micro_batch=1 train.global_batch=1)
      pt_objective=(--batch 1)
      task="" full_name="full SFT" ;;
  dpo)
    $PY - "$out/pairs.jsonl" "$SEQ" <<'PY'
import json, random, sys
rng, half = random.Random(0), int(sys.argv[2]) // 2 - 1
word = lambda n: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
with open(sys.argv[1], "w") as f:
    for _ in range(64):
        f.write(json.dumps({"prompt": word(half), "chosen": word(half), "rejected": word(half)}) + "\n")
PY
    nk_cmd=(align align.method=dpo align.beta=0.1 align.data_path=$out/pairs.jsonl
            train.micro_batch=2 train.global_batch=2)
    pt_objective=(--batch 2 --objective dpo --completion $(( SEQ / 2 )) --beta 0.1)
    task="DPO " full_name="DPO full, reference precomputed" ;;
  *) echo "OBJECTIVE must be lm or dpo, not '$OBJECTIVE'" >&2; exit 2 ;;
esac

# run_nekton NAME GROUP KEY=VALUE...: one `nekton train` run, its mean tokens/s,
# step time and peak memory appended to $results.
run_nekton() {
  local name=$1 group=$2; shift 2
  local dir=$out/$group log=$out/$group.log
  echo "== $name"
  local t0=$SECONDS
  "$BIN" "${nk_cmd[@]}" model.preset=$PRESET data.tokenizer=bytes \
    train.dtype=$NK_DTYPE train.seq_len=$SEQ \
    train.steps=$STEPS train.val_every=0 train.log_every=1 train.peak_tflops=1 \
    train.threads=$THREADS train.out_dir=$dir "$@" >"$log" 2>&1 &
  nk_pid=$!
  # Wait for the last step's metrics record, then (unless KEEP_SAVE) stop the
  # run before its checkpoint and model saves.
  while kill -0 "$nk_pid" 2>/dev/null; do
    if [[ ${KEEP_SAVE:-0} != 1 && -f $dir/metrics.jsonl ]] &&
       (( $(wc -l <"$dir/metrics.jsonl") >= STEPS )); then
      kill -KILL "$nk_pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  local rc=0
  wait "$nk_pid" 2>/dev/null || rc=$?
  nk_pid=
  grep -E '\] (model |peft: |memory per rank:|data |align: )' "$log" || true
  grep -E '^step ' "$log" | sed 's/^/  /' || true
  local got=0
  [[ -f $dir/metrics.jsonl ]] && got=$(wc -l <"$dir/metrics.jsonl")
  if (( got < STEPS )); then
    echo "nekton failed (exit $rc, $got of $STEPS steps); last lines of its log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  echo "  ($(( SECONDS - t0 )) s wall, start-up included)"
  $PY - "$dir/metrics.jsonl" "$SKIP" "$name" "$group" >>"$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = rows[int(sys.argv[2]):]
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
ms = sum(r["step_ms"] for r in rows) / len(rows)
mem = max(r["peak_mem_bytes"] for r in rows)
rss = max(r["peak_rss_bytes"] for r in rows)
print(f"{sys.argv[3]}\t{sys.argv[4]}\tnekton\t{tps:.2f}\t{ms:.1f}\t{mem}\t{rss}")
PY
  tail -n 1 "$results" | awk -F'\t' '{printf "RESULT %s: tokens_per_s=%s step_ms=%s peak_mem_bytes=%s peak_rss_bytes=%s\n", $1, $4, $5, $6, $7}'
}

# run_torch NAME GROUP ARGS...: bench/torch_lora_bench.py, appended to $results.
run_torch() {
  local name=$1 group=$2; shift 2
  (( NO_TORCH )) && return 0
  echo "== $name"
  local t0=$SECONDS log=$out/torch_$group.log
  if ! $PY bench/torch_lora_bench.py --shape $SHAPE --seq $SEQ "${pt_objective[@]}" --warmup 1 \
      --steps $PT_STEPS --threads $THREADS --dtype $TORCH_DTYPE "$@" >"$log" 2>&1; then
    echo "torch_lora_bench.py failed; last lines:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  sed 's/^/  /' "$log" | grep -v '^  {'
  echo "  ($(( SECONDS - t0 )) s wall, start-up included)"
  $PY - "$log" "$name" "$group" >>"$results" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"{sys.argv[2]}\t{sys.argv[3]}\ttorch\t{r['tokens_per_s']:.2f}\t{r['step_ms_mean']:.1f}\t\t{r['peak_rss_bytes']}")
PY
}

case "$TORCH_DTYPE" in
  bf16|fp32) ;;
  auto)
    if (( NO_TORCH )); then TORCH_DTYPE=fp32; else
    probe=$($PY bench/torch_lora_bench.py --probe --threads "$THREADS")
    echo "PyTorch GEMM probe (GFLOP/s, 256x1024x1024): $probe"
    TORCH_DTYPE=$($PY -c 'import json,sys; p=json.loads(sys.argv[1]); print("bf16" if p["bf16"] >= 0.5 * p["fp32"] else "fp32")' "$probe")
    if [[ $TORCH_DTYPE == fp32 ]]; then
      echo "WARNING: this PyTorch has no fast bf16 matrix product on this CPU (no AVX-512?):" \
           "the PyTorch rows run in fp32 (TORCH_DTYPE=bf16 forces bf16)" >&2
    fi; fi ;;
  *) echo "TORCH_DTYPE must be auto, bf16 or fp32" >&2; exit 2 ;;
esac
if [[ $TORCH_DTYPE == bf16 ]]; then pt_lora="bf16 autocast, bf16 frozen base"; pt_full="bf16 autocast, fp32 params"
else pt_lora="fp32, fp32 frozen base"; pt_full="fp32"; fi

lora_layers=()
pt_layers=()
label=$PRESET
if (( LAYERS > 0 )); then
  lora_layers=(model.n_layer=$LAYERS); pt_layers=(--layers $LAYERS); label="$PRESET, $LAYERS layers"
fi
echo "LoRA r=$RANK alpha=$ALPHA all-linear, $label, objective $OBJECTIVE, ${pt_objective[1]} rows x $SEQ, $THREADS threads;" \
     "Nekton $STEPS steps (mean of the last $PT_STEPS), PyTorch 1 warm-up + $PT_STEPS"
for method in $METHODS; do
  case $method in
    lora) run_nekton "Nekton ${task}LoRA ($label, $NK_DTYPE)" lora peft.method=lora \
            peft.target_modules=all-linear peft.lora_rank=$RANK peft.lora_alpha=$ALPHA \
            "${lora_layers[@]}" ;;
    qlora) run_nekton "Nekton ${task}QLoRA ($label, NF4 base, $NK_DTYPE)" qlora peft.method=qlora \
             peft.target_modules=all-linear peft.lora_rank=$RANK peft.lora_alpha=$ALPHA \
             "${lora_layers[@]}" ;;
    ia3) run_nekton "Nekton ${task}IA3 ($label, PEFT's targets, $NK_DTYPE)" ia3 peft.method=ia3 \
           "${lora_layers[@]}" ;;
    adapter) run_nekton "Nekton ${task}bottleneck adapters ($label, NeMo's targets, $NK_DTYPE)" adapter \
               peft.method=adapter "${lora_layers[@]}" ;;
    *) echo "METHODS: unknown method '$method' (lora, qlora, ia3, adapter)" >&2; exit 2 ;;
  esac
done
run_torch "PyTorch ${task}LoRA ($label, $pt_lora)" lora --mode lora --rank $RANK \
  --alpha $ALPHA "${pt_layers[@]}"
if (( FULL_LAYERS > 0 )); then
  run_nekton "Nekton ${full_name} ($PRESET, $FULL_LAYERS layers, $NK_DTYPE)" full peft.method=none \
    model.n_layer=$FULL_LAYERS
  run_torch "PyTorch ${full_name} ($PRESET, $FULL_LAYERS layers, $pt_full)" full \
    --mode full --layers $FULL_LAYERS
fi

echo
$PY - "$results" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
torch_tps = {r[1]: float(r[3]) for r in rows if r[2] == "torch"}
def gib(b):
    b = int(b)
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"
print("| run | tokens/s | step ms | peak memory | ratio vs PyTorch |")
print("|---|---:|---:|---:|---:|")
for name, group, fw, tps, ms, mem, rss in rows:
    tps = float(tps)
    if fw == "nekton":
        memory = f"{gib(mem)} tensors, {gib(rss)} RSS"
        ref = torch_tps.get(group, torch_tps.get("lora"))  # adapters: PyTorch's LoRA step
        ratio = f"**{tps / ref:.2f}x**" if ref else "n/a"
    else:
        memory = f"{gib(rss)} RSS"
        ratio = "1x"
    print(f"| {name} | {tps:.1f} | {float(ms):.0f} | {memory} | {ratio} |")
PY
