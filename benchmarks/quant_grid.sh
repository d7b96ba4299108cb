#!/usr/bin/env bash
# The quantization grid of BENCHMARKS.md: the tiny model on all 250 real BBH boolean_expressions and web_of_lies
# questions, batch 8, for each weight setting; threshold methods first (minutes), vanilla last (hours on 1 core).
#   benchmarks/quant_grid.sh DATA OUT [PHASE...]    PHASE: fast (fastdllm,cai), vanilla; default both
#   VANILLA_LIMIT=N: the vanilla phase on the first N questions of each task only, no warm-up (default: all)
# Then: python benchmarks/quant_table.py OUT
set -euo pipefail
data=${1:?data folder (with bbh/)}; out=${2:?output folder}; shift 2
phases=${*:-fast vanilla}
mkdir -p "$out"
declare -A flags=([fp32]="--dtype float32" [bf16]="--dtype bfloat16" [int8]="--quantize int8"
                  [int8-dynamic]="--quantize int8-dynamic" [int4]="--quantize int4 --dtype bfloat16")
declare -A methods=([fast]="fastdllm,cai" [vanilla]="vanilla")
declare -A limits=([fast]="" [vanilla]="${VANILLA_LIMIT:+--limit $VANILLA_LIMIT --no-warmup}")
for phase in $phases; do
    for setting in fp32 bf16 int8 int8-dynamic int4; do
        dest="$out/$setting-$phase"
        [ -f "$dest/results.json" ] && { echo "skip $dest (done)"; continue; }
        echo "$(date -u +%H:%M:%S) $setting $phase"
        # shellcheck disable=SC2086
        caidllm bench --model tiny --task bbh:boolean_expressions --task bbh:web_of_lies --methods "${methods[$phase]}" \
            --batch-size 8 --gen-length 256 --block-length 64 --data-dir "$data" --device cpu ${flags[$setting]} \
            ${limits[$phase]} --no-progress --out "$dest" > "$dest.log" 2>&1 || echo "FAILED $dest (see $dest.log)"
    done
done
echo "$(date -u +%H:%M:%S) done"
