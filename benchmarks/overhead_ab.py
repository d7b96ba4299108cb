"""Engine overhead of two code trees in one run: benchmarks/overhead.py on tree A, then on tree B,
alternating for --rounds rounds (so both see the same machine load), on one random checkpoint.
Prints each run and the median per tree and method (BENCHMARKS.md, "Engine overhead").

    python benchmarks/overhead_ab.py OLD_TREE NEW_TREE --rounds 3 --methods vanilla,fastdllm,cai --steps 32
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

ap = argparse.ArgumentParser()
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--methods", default="vanilla,fastdllm,fastdllm-prefix,es-dllm,cai,cai-es")
ap.add_argument("--steps", type=int, default=32)
ap.add_argument(
    "--shape",
    default="hidden_size=256,n_layers=4,n_heads=4,n_kv_heads=4,intermediate_size=512,"
    "vocab_size=4096,max_length=1024",
)
args = ap.parse_args()

# the writer needs the new tree
sys.path[:0] = [
    str(HERE.parent / "tests"),
    str(Path(args.new).resolve() / "src"),
]
from helpers.checkpoints import write_random_checkpoint  # noqa: E402

sizes = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
folder = write_random_checkpoint(Path(tempfile.mkdtemp()) / "ckpt", "llada", **sizes)
runs = {"old": [], "new": []}
for round_ in range(args.rounds):
    for name in ("old", "new"):
        tree = Path(getattr(args, name)).resolve()
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}
        out = subprocess.run(
            [sys.executable, str(HERE / "overhead.py"), str(folder), args.methods, str(args.steps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        runs[name].append(rows)
        print(json.dumps({"round": round_, "tree": name, "rows": rows}), flush=True)
print("| Method | Wall old (s) | Overhead old | Wall new (s) | Overhead new |")
print("|---|---|---|---|---|")
for i, method in enumerate(args.methods.split(",")):
    cells = []
    for name in ("old", "new"):
        cells.append(statistics.median(r[i]["wall"] for r in runs[name]))
        cells.append(statistics.median(r[i]["overhead"] for r in runs[name]))
    print(f"| {method} | {cells[0]:.2f} | {100 * cells[1]:.1f}% | {cells[2]:.2f} | {100 * cells[3]:.1f}% |")
