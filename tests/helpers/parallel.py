"""The ranks of the tensor-parallel tests: one spawn of 4 gloo ranks on 127.0.0.1 computes
everything tests/test_tensor_parallel.py checks (tp 2 on ranks {0, 1} and {2, 3} at once,
tp 4 on all four), and each group's rank 0 writes its results to out/rank{r}.pt."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

SMALL = (
    "num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=4&head_dim=16"
    "&vocab_size=512"
)
MOE = "&num_experts=16&moe_intermediate_size=32"
# name -> generate keywords; every shape divides by 4 (heads, KV heads, widths, experts).
MODELS = {
    "tiny": dict(method="fastdllm", gen_length=16, block_length=8),
    "tiny-bd": dict(method="fastdllm", gen_length=16, block_length=8),
    f"random:llada2-mini?{SMALL}{MOE}&rotary_dim=8&intermediate_size=128": dict(
        gen_length=32, block_length=32
    ),
    # LLaDA2.2: block routing (a pool of 8 of 16 experts), the InDel decoder (edit tokens in the vocabulary)
    f"random:llada2.2-flash?{SMALL}{MOE}&rotary_dim=8&intermediate_size=128&expert_capacity=8"
    "&delete_token_id=500&split_token_id=501": dict(method="llada2.2", gen_length=32, block_length=32),
    f"random:sdar-30b-a3b?{SMALL}{MOE}&intermediate_size=128": dict(gen_length=8, block_length=4),
    "random:llada-moe-7b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=4"
    "&vocab_size=512&num_experts=16&expert_intermediate_size=32": dict(
        method="fastdllm", gen_length=16, block_length=8
    ),
    # The 2026 families: Stable-DiffCoder's Llama attention, RND1's shifted Qwen3-MoE.
    "random:stable-diffcoder-8b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
    "&num_key_value_heads=4&vocab_size=512&intermediate_size=128": dict(
        method="sdar-static", gen_length=8, block_length=4
    ),
    f"random:rnd1-30b-a3b?{SMALL}{MOE}": dict(method="fastdllm", gen_length=16, block_length=8),
}
# Checkpoint folders the test writes (tests/block_checkpoints.py): read part by part on each rank
# (parallel/loading.py); the embedded tiny models are folders too, the random: shapes are drawn whole.
FOLDERS = {
    "llada2-folder": (dict(gen_length=32, block_length=32), "llada2"),
    "sdar-moe-folder": (dict(gen_length=8, block_length=4), "sdar-moe"),
}
TP2_ONLY = set(FOLDERS)  # 2 key/value heads
PROMPTS = ["What is 2 plus 3?", "not True and False is", "Tell me a story about a dog and a cat"]


def canvas(vocab: int):
    """Two left-padded rows for the logits check."""
    ids = torch.randint(3, min(vocab, 500), (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


def decode(lm, name: str, **extra):
    options = {**(MODELS[name] if name in MODELS else FOLDERS[name][0]), **extra}
    return [r.token_ids for r in lm.generate(PROMPTS, chat=False, **options)]


def cancel_midway(lm) -> list:
    """Three requests, two slots: after one step the first still in flight is cancelled and the
    third joins; every request's tokens, None for the cancelled one (rank 0 broadcasts the cancel;
    the others replay it)."""
    from caidllm.decode.api import tokenize_prompts
    from caidllm.decode.engine import Engine
    from caidllm.decode.presets import build_config

    config = build_config("fastdllm", gen_length=16, block_length=8)
    engine = Engine(lm, max_batch=2)
    ids = [engine.submit(p, config) for p in tokenize_prompts(lm, PROMPTS, chat=False)]
    events = engine.step()
    engine.cancel(next(i for i in ids if engine.scheduler.holds(i)))
    results = {e.request_id: e.result.token_ids for e in [*events, *engine.run()] if e.finished}
    return [results.get(i) for i in ids]


def load_rank(name: str, tp):
    import caidllm
    from caidllm.parallel.loading import ShardedLoad
    from caidllm.parallel.sharding import shard_model

    if tp is None:
        return caidllm.load(name, device="cpu", dtype="float32")
    return shard_model(caidllm.load(name, device="cpu", dtype="float32", shard=ShardedLoad(tp)), tp)


def run_rank(rank: int, world: int, port: int, out: str, folders: dict) -> None:
    from caidllm.parallel.mesh import TPGroup
    from caidllm.parallel.mirror import Mirror, follow

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    groups = {
        2: TPGroup(rank % 2, 2, pairs[rank // 2], pairs[rank // 2]),
        4: TPGroup(rank, 4, dist.group.WORLD, dist.group.WORLD),
    }
    results = {}
    for name in [*MODELS, *FOLDERS]:
        for size in (1, 2, 4):
            if size == 1 and rank != 0 or size == 4 and name in TP2_ONLY:
                continue
            tp = groups.get(size)
            lm = load_rank(folders.get(name, name), tp)
            ids, mask = canvas(lm.config.vocab_size)
            logits = lm.forward(ids, mask)
            if tp is not None and tp.rank != 0:
                follow(lm, tp)
                continue
            if tp is not None:
                lm.mirror = Mirror(tp)
            entry = {"logits": logits, "tokens": decode(lm, name), "kv_heads": lm.config.n_kv_heads}
            if name == "tiny" and size in (1, 2):  # batch invariance: alone, batched, joining mid-flight
                entry["alone"] = [decode(lm, name, batch_size=1)]
                entry["joining"] = decode(lm, name, batch_size=2)
                # each request's generator on every rank
                entry["sampled"] = decode(lm, name, temperature=0.8, seed=3)
                entry["cancelled"] = cancel_midway(lm)
            if tp is not None:
                entry["collectives"] = tp.collectives
                lm.mirror.stop()
            results[(name, size)] = entry
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()
