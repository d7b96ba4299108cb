"""DiffusionGemma under --tp: 2 gloo ranks give one process's logits (to 1e-5 of their scale) and the same
tokens (greedy, diffusiongemma-cai), and `caidllm generate --tp 2` prints one process's tokens;
`caidllm models --plan` plans the family and refuses a degree
that does not divide its full layers' 2 key/value heads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers.models.diffusion_gemma")

from caidllm.cli import main
from caidllm.errors import InputError
from caidllm.models.inventory import describe
from caidllm.models.plan import memory_plan
from caidllm.parallel.mesh import free_port
from helpers.dg_parallel import SHAPE, results, run_rank
from helpers.dg_reference import engine_lm, reference, saved

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_two_ranks_give_the_logits_and_tokens_of_one_process(tmp_path):
    model = reference(seed=3, canvas_length=8, **SHAPE)
    torch.save(saved(model), tmp_path / "model.pt")
    mp.start_processes(
        run_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn"
    )
    sharded = torch.load(tmp_path / "rank0.pt")
    lm = engine_lm(model)
    with torch.no_grad():
        whole = results(lm)
    scale = whole["logits"].abs().max().item()
    assert (sharded["logits"] - whole["logits"]).abs().max().item() <= 1e-5 * max(scale, 1.0)
    assert sharded["tokens"] == whole["tokens"]
    assert sharded["collectives"] > 0  # the forwards did sum over the ranks
    assert sharded["q_rows"] * 2 == lm.model.backbone.layers[1].self_attn.q_proj.out_features  # a full layer


def test_the_plan_divides_the_weights_and_refuses_a_degree_the_full_layers_do_not_allow():
    described = describe("random:diffusiongemma-26b-a4b")
    one = memory_plan(described, 1, torch.bfloat16, 80, 8192)
    two = memory_plan(described, 2, torch.bfloat16, 80, 8192)
    assert (
        one.cache == "canvas" and two.kv_bytes_per_request_per_rank * 2 == one.kv_bytes_per_request_per_rank
    )
    assert two.weights_bytes_per_rank < one.weights_bytes_per_rank
    assert one.sharded_parameters + one.replicated_parameters == 25_250_986_752  # the released total
    with pytest.raises(InputError, match="2 key/value heads of the full-attention layers"):
        memory_plan(described, 4, torch.bfloat16, 80, 8192)


CLI = [
    "What is 2+3?",
    "Hello there",
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--seed",
    "1",
    "--method",
    "diffusiongemma-cai",
    "--set",
    "max_denoising_steps=4",
    "--gen-length",
    "16",
    "--json",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A checkpoint folder (each rank reads it whole, then keeps its share: models/loading.py)."""
    from helpers.checkpoints import write_tokenizer

    path = tmp_path_factory.mktemp("dg-tp")
    model = reference(seed=5, vocab_size=448, canvas_length=8, image_token_id=440, **SHAPE)
    model.save_pretrained(path)
    write_tokenizer(path, "llada", 512)
    return str(path)


def test_generate_tp_2_prints_the_tokens_of_one_process(capsys, folder):
    """The command spawns rank 1, which replays rank 0's UniformEngine inputs (parallel/mirror.py)."""
    assert main(["generate", *CLI, "--model", folder]) == 0
    alone = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.splitlines()]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "caidllm", "generate", *CLI, "--model", folder, "--tp", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["token_ids"] for line in done.stdout.splitlines()] == alone


def test_a_tp_the_heads_do_not_divide_is_one_line_before_any_rank_starts(capsys, folder):
    assert main(["generate", *CLI, "--model", folder, "--tp", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("caidllm: error: --tp 4 does not divide the model's 2 key/value heads")


SERVED = {
    "model": "m",
    "prompt": "What is 2+3?",
    "max_tokens": 16,
    "seed": 1,
    "method": "diffusiongemma-cai",
    "max_denoising_steps": 4,
    "dgcai": {"entropy_start": 20.0, "entropy_end": 20.0},
}


def test_serve_tp_2_answers_as_one_process_and_a_cancel_leaves_the_ranks_in_step(folder):
    """A served request under --tp 2 (rank 1 replays rank 0's UniformEngine) gives one process's answer;
    a stream dropped mid-request (a cancel replayed on rank 1) leaves the next answer unchanged."""
    import httpx

    import caidllm
    from helpers.serve import free_port, spawn_serve, start

    def ask(url, **extra):
        body = {**SERVED, **extra, "model": httpx.get(f"{url}/caidllm/info").json()["model"]}
        return httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()

    with start(caidllm.load(folder, device="cpu", dtype="float32")) as server:
        alone = ask(server.url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn_serve(port, "--model", folder, "--dtype", "float32", "--tp", "2")
    try:
        first = ask(url)
        body = {**SERVED, "model": first["model"], "max_tokens": 400, "stream": True}
        body.update(adaptive_stop=False, max_denoising_steps=48)
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as stream:
            next(stream.iter_lines())  # the request runs; leaving the stream cancels it
        again = ask(url)
        healthy = httpx.get(f"{url}/health").status_code
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    assert first["choices"] == again["choices"] == alone["choices"] and healthy == 200
