#!/usr/bin/env bash
# The model card's accuracy table for a model: vanilla decoding at the card's
# settings (gen 256, block 8, batch 16) on every task. Run it with nothing
# else using the CPU; it takes about 25 minutes on 2 cores (the shipped model).
# Usage: training/evaluate.sh MODEL OUT_DIR [DATA_DIR]
#   MODEL: 'tiny' or an exported model folder (caidllm train --export DIR)
#   DATA_DIR: the benchmark data folder (default: where `caidllm bench` looks)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 MODEL OUT_DIR [DATA_DIR]" >&2
    exit 2
fi
model=$1 out=$2
settings=(--model "$model" --methods vanilla --gen-length 256 --block-length 8 --batch-size 16 --no-progress)
run() {  # name, then bench flags
    local name=$1; shift
    if ! caidllm bench "${settings[@]}" --out "$out/$name" "$@" > "$out/$name.log" 2>&1; then
        echo "bench $name failed, see $out/$name.log:" >&2
        tail -n 5 "$out/$name.log" >&2
        exit 1
    fi
    grep -E "^## [a-z]+:|^\| vanilla" "$out/$name/results.md" | cut -c1-90
}
mkdir -p "$out"
run bbh --task bbh:boolean_expressions --task bbh:web_of_lies ${3:+--data-dir "$3"}
run synth --task synthetic:boolean_expressions --task synthetic:web_of_lies --task synthetic:dyck_languages \
    --task synthetic:navigate --task synthetic:multistep_arithmetic_two --limit 64
run arith --task synthetic:arithmetic --limit 128
