#!/usr/bin/env bash
# Train in 25-minute processes, each resuming the last checkpoint, until the
# run is done or a file STOP appears in the run folder. (A process's memory
# grows with every new batch shape on CPU; a fresh process resets it.)
# Usage: training/run_chunks.sh RUN_DIR [more `caidllm train` flags]
set -euo pipefail
run_dir=$1; shift
mkdir -p "$run_dir"
while [ ! -e "$run_dir/STOP" ]; do
    caidllm train --out "$run_dir" --time-limit-s 1500 "$@" 2>>"$run_dir/progress.txt"
    # A finished run's last log line is its final validation; a stopped one's is the time-limit event.
    if tail -n 1 "$run_dir/train.log" | grep -q '"validation"'; then break; fi
    # A process that trained no step (it only logged its resume) would loop for ever: stop.
    if tail -n 1 "$run_dir/train.log" | grep -q '"resumed"'; then
        echo "run_chunks: a chunk trained no step; stopping (see $run_dir/train.log)" >&2; exit 1
    fi
done
