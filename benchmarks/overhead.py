"""Engine overhead of each method on one code tree: wall, forward share, policy share, and
overhead = wall - forwards - policy (BENCHMARKS.md, "Engine overhead"). It needs no feature of
the tree it measures beyond generate(), so the same script times an older commit too
(PYTHONPATH=OLD/src). Random prompts; pass a model folder (a random checkpoint of the wanted shape,
tests/helpers/checkpoints.py: write_random_checkpoint) so both trees load the same weights.

    python benchmarks/overhead.py MODEL_DIR vanilla,fastdllm,cai 32    # methods, total steps
"""

import json
import sys
import time

import torch

import caidllm

path, methods, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
lm = caidllm.load(path, device="cpu", dtype="float32")
fwd = {"s": 0.0}
inner = lm.model.forward


def timed(*a, **k):
    t = time.perf_counter()
    out = inner(*a, **k)
    fwd["s"] += time.perf_counter() - t
    return out


lm.model.forward = timed
g = torch.Generator().manual_seed(0)
prompts = [
    torch.randint(10, 300, (int(n),), generator=g).tolist() for n in torch.randint(30, 60, (8,), generator=g)
]
rows = []
for m in methods:
    kw = dict(method=m, gen_length=256, block_length=64, early_stop=False, batch_size=8, steps=steps)
    lm.generate(prompts[:2], **{**kw, "gen_length": 64, "steps": None if steps is None else 16})  # warm-up
    fwd["s"] = 0.0
    t = time.perf_counter()
    rs = lm.generate(prompts, **kw)
    wall = time.perf_counter() - t
    pol = getattr(rs[0], "policy_s", None) or rs[0].controller_s  # controller_s: trees before the rename
    rows.append(
        dict(
            method=m,
            wall=wall,
            fwd=fwd["s"] / wall,
            policy=pol / wall,
            overhead=(wall - fwd["s"] - pol) / wall,
            nfe=sum(r.nfe for r in rs) / len(rs),
        )
    )
    print(json.dumps(rows[-1]), flush=True)
