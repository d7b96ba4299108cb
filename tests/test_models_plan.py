"""`caidllm models --plan MODEL --tp N` (models/plan.py): weights per rank, KV cache per request,
requests that fit, re-computed here by hand from the config; and its bad input (exit 2, one line)."""

import json

import pytest

from caidllm.cli import main
from caidllm.models.inventory import describe
from caidllm.models.plan import GIB, USABLE, memory_plan, split_parameters

SMALL = (
    "random:llada2-mini?num_hidden_layers=3&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512"
)


def by_hand(tp, gpu_gib, context):
    """LLaDA2's parameters counted from its config: what --tp divides, what every rank holds."""
    h, heads, kv_heads, hd, ff, eff, experts, layers, vocab = 64, 4, 2, 16, 128, 32, 16, 3, 512
    attention = h * (heads + 2 * kv_heads) * hd + heads * hd * h
    dense_ff, expert = 3 * h * ff, 3 * h * eff
    sharded = layers * attention + dense_ff + (layers - 1) * (experts + 1) * expert  # +1: the shared expert
    norms = layers * (2 * h + 2 * hd) + h  # input / post-attention norms, q / k norms; the final norm
    routers = (layers - 1) * experts * h
    replicated = 2 * vocab * h + norms + routers
    weights = 2 * (sharded // tp + replicated)
    kv = 2 * layers * kv_heads * hd * context * 2 // tp
    budget = int(USABLE * gpu_gib * GIB) - weights
    return sharded, replicated, weights, kv, budget // kv


@pytest.mark.parametrize("tp", [1, 2])
def test_the_plan_equals_the_sizes_counted_by_hand(tp):
    import torch

    plan = memory_plan(describe(SMALL), tp, torch.bfloat16, 0.01, 256)
    sharded, replicated, weights, kv, fits = by_hand(tp, 0.01, 256)
    assert (plan.sharded_parameters, plan.replicated_parameters) == (sharded, replicated)
    assert plan.weights_bytes_per_rank == weights and plan.kv_bytes_per_request_per_rank == kv
    assert plan.requests_that_fit == fits > 0


def test_every_parameter_is_counted_once():
    described = describe("random:llada-moe-7b")
    sharded, replicated = split_parameters(described.model)
    assert sharded + replicated == sum(p.numel() for p in described.model.parameters())


def test_the_command_prints_the_plan_and_its_json(capsys):
    flash = ["models", "--plan", "random:llada2-flash"]
    assert main([*flash, "--tp", "4", "--gpu-memory", "80", "--context", "4096"]) == 0
    out = capsys.readouterr().out
    assert "tp 4, bfloat16, 80 GiB per GPU" in out and "weights per rank: 49.76 GiB" in out
    assert "requests that fit: " in out
    assert main(["models", "--plan", "random:llada2-mini", "--tp", "2", "--context", "4096", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tp"] == 2 and plan["context"] == 4096 and plan["requests_that_fit"] > 0
    assert main(["models", "--plan", "random:llada2-flash", "--tp", "1"]) == 0
    assert "does not fit" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tp", "3"], "--tp 3 does not divide the model's 16 attention heads"),
        (["--tp", "8"], "--tp 8 does not divide the model's 4 key/value heads"),
        (["--tp", "0"], "--tp must be a positive integer, got 0"),
        (["--gpu-memory", "0"], "--gpu-memory must be a positive number of GiB, got 0.0"),
        (["--context", "0"], "--context must be a positive number of positions, got 0"),
        (["--model", "tiny"], "--plan MODEL takes its model itself"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(["models", "--plan", "random:llada2-mini", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_experts_that_do_not_divide_are_named(capsys):
    shape = "random:sdar-30b-a3b?num_experts=10"
    assert main(["models", "--plan", shape, "--tp", "4"]) == 2
    assert "--tp 4 does not divide the model's 10 experts (num_experts)" in capsys.readouterr().err
