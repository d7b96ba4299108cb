"""Benchmark runner: every decoding method on the same examples, one process.

    caidllm bench --model tiny --task synthetic:arithmetic --methods vanilla,fastdllm,cai --limit 64 \\
        --out runs/bench

or from Python: ``run_bench(BenchConfig(...))``. See BENCHMARKS.md.
"""

from caidllm.bench.runner import BenchConfig, run_bench
from caidllm.bench.tasks import TASK_KINDS, load_task

__all__ = ["BenchConfig", "run_bench", "load_task", "TASK_KINDS"]
