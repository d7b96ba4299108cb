"""Tensor and expert parallelism on CPU (gloo): a model divided among 2 or 4 ranks gives the
logits of one process (to 1e-5 of their scale) and the same tokens, for every family caidllm shards; batch
invariance holds at tp 2. Checkpoint folders are read part by part on each rank, random shapes
drawn whole then divided: both paths run. One spawn of 4 ranks serves the whole module
(tests/helpers/parallel.py)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from block_checkpoints import write_block_checkpoint
from caidllm.parallel.mesh import free_port
from helpers.parallel import FOLDERS, MODELS, TP2_ONLY, run_rank


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    folders = {name: str(write_block_checkpoint(out / name, kind)) for name, (_, kind) in FOLDERS.items()}
    mp.start_processes(
        run_rank, args=(4, free_port(), str(out), folders), nprocs=4, join=True, start_method="spawn"
    )
    merged = {}
    for rank in (0, 2):  # each tp-2 pair's rank 0 (rank 0 also holds tp 1 and tp 4)
        merged.update({(k, rank): v for k, v in torch.load(out / f"rank{rank}.pt").items()})
    return merged


@pytest.mark.parametrize("name", [*MODELS, *FOLDERS])
@pytest.mark.parametrize("size, rank", [(2, 0), (2, 2), (4, 0)])
def test_sharded_logits_and_tokens_equal_one_process(ranks, name, size, rank):
    if size == 4 and name in TP2_ONLY:
        pytest.skip("2 key/value heads: tp 2 only")
    whole, sharded = ranks[((name, 1), 0)], ranks[((name, size), rank)]
    assert sharded["kv_heads"] * size == whole["kv_heads"]  # each rank's cache holds its share of the heads
    # 1e-5 of the logits' scale: the ranks' partial sums add in another order than one matmul's.
    scale = whole["logits"].abs().max().item()
    assert (sharded["logits"] - whole["logits"]).abs().max().item() <= 1e-5 * max(scale, 1.0)
    assert sharded["tokens"] == whole["tokens"]
    assert sharded["collectives"] > 0


def test_batch_invariance_at_tp_2(ranks):
    whole, sharded = ranks[(("tiny", 1), 0)], ranks[(("tiny", 2), 0)]
    assert sharded["alone"][0] == whole["alone"][0] == whole["tokens"]
    assert sharded["tokens"] == sharded["joining"] == sharded["alone"][0]
    assert sharded["sampled"] == whole["sampled"] != whole["tokens"]  # sampling (temperature 0.8, seed 3) too
    # a cancel mid-run, then a queued request joins: the others' tokens unchanged
    assert sharded["cancelled"] == whole["cancelled"] and whole["cancelled"].count(None) == 1
    assert all(t is None or t == alone for t, alone in zip(whole["cancelled"], whole["tokens"]))
