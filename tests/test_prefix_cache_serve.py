"""The prefix store behind `caidllm serve` (tiny-bd, 127.0.0.1, free port): a repeated chat prompt takes its
blocks from the store with the same answer, the stream's first step says so (the live view draws it), and
/metrics counts it; bad budgets at the command line."""

import json

import httpx
import pytest

import caidllm
from caidllm.cli import main
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults
from helpers.serve import metric

SYSTEM = "You answer in one word. " * 6
BODY = {
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "True and False is"}],
    "method": "llada2",
    "gen_length": 16,
    "block_length": 8,
    "stream": True,
    "commit_events": True,
}


@pytest.fixture(scope="module")
def server():
    lm = caidllm.load("tiny-bd", device="cpu", dtype="float32")
    defaults = ServerDefaults(
        model_name="tiny-bd", method="llada2", gen_length=16, block_length=8, max_gen_length=64
    )
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults, max_batch=2, prefix_cache_mb=16))) as s:
        yield s


def stream(url, body):
    """(the prefix_cache object of the stream, the answer text)."""
    info, text = None, ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                info = chunk.get("caidllm", {}).get("prefix_cache", info)
                text += "".join(c.get("delta", {}).get("content") or "" for c in chunk["choices"])
    return info, text


def test_a_repeated_prompt_is_served_from_the_store(server):
    first, text = stream(server.url, BODY)
    again, same = stream(server.url, BODY)
    assert first["reused_positions"] == 0 and first["block_length"] == 8
    assert again["prompt_positions"] == first["prompt_positions"] > 16
    assert again["reused_positions"] == first["prompt_positions"] // 8 * 8
    assert same == text
    assert metric(server.url, "caidllm_prefix_cache_hits_total") >= 1
    assert (
        metric(server.url, "caidllm_prefix_cache_prefill_positions_saved_total") >= again["reused_positions"]
    )
    assert metric(server.url, "caidllm_prefix_cache_blocks") > 0
    assert 0 < metric(server.url, "caidllm_prefix_cache_bytes") <= 16 << 20


def test_without_commit_events_the_stream_carries_no_prefix_info(server):
    info, _ = stream(server.url, {**BODY, "commit_events": False})
    assert info is None


@pytest.mark.parametrize(
    "argv, words",
    [
        (["generate", "--model", "tiny-bd", "--prefix-cache-mb", "lots", "hi"], "off), got 'lots'"),
        (
            ["generate", "--model", "tiny-bd", "--prefix-cache-mb", "1e12", "hi"],
            "is more than the memory of device cpu",
        ),
        (
            ["serve", "--model", "tiny-bd", "--prefix-cache-mb", "-1"],
            "--prefix-cache-mb must be a number of MB >= 0",
        ),
        (
            ["serve", "--model", "tiny", "--block-length", "16", "--prefix-cache-mb", "8"],
            "does not apply to the llada model",
        ),
        (
            [
                "bench",
                "--model",
                "tiny-bd",
                "--task",
                "synthetic:boolean_expressions",
                "--prefix-cache-mb",
                "0,x",
            ],
            "must be a number of MB >= 0",
        ),
        (
            [
                "bench",
                "--model",
                "tiny-bd",
                "--task",
                "synthetic:boolean_expressions",
                "--prefix-cache-mb",
                "0,0",
            ],
            "lists a budget twice",
        ),
    ],
)
def test_bad_budgets_at_the_command_line(capsys, argv, words):
    assert main(argv + ["--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_bench_runs_each_method_with_the_store_off_and_on(tmp_path):
    """`--prefix-cache-mb 0,16`: two rows per method, the same answers, the on row's prompts partly reused."""
    from pathlib import Path

    from caidllm.bench import BenchConfig, run_bench

    data = Path(__file__).parent / "data" / "bench"
    report = run_bench(
        BenchConfig(
            model="tiny-bd",
            tasks=["bbh:boolean_expressions"],
            methods=["llada2"],
            limit=2,
            fewshot=2,
            batch_size=1,
            gen_length=16,
            block_length=8,
            data_dir=str(data),
            device="cpu",
            dtype="float32",
            warmup=False,
            progress=False,
            out=str(tmp_path),
            prefix_cache_mb=(0.0, 16.0),
        ),
        log=lambda message: None,
    )
    off, on = report["results"]
    assert (off["method"], on["method"]) == ("llada2 [prefix cache off]", "llada2 [prefix cache 16 MB]")
    assert off["prefill_saved_share"] == 0 and on["prefill_saved_share"] > 0
    assert on["prefill_positions_mean"] < off["prefill_positions_mean"]
    answers = [
        [json.loads(line)["generated"] for line in (tmp_path / row["samples"]).read_text().splitlines()]
        for row in (off, on)
    ]
    assert answers[0] == answers[1]
    assert "Prefill/req" in (tmp_path / "results.md").read_text()
