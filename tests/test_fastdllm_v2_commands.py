"""Fast-dLLM v2 through every command on a tiny random checkpoint in its layout: generate (and its
refusals, exit 2 with one line), bench, serve (answers as generate; refusals HTTP 400 naming the
field; the commit events the live view draws), lm-eval and calibrate."""

import json

import httpx
import pytest

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.cli import main
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults
from helpers.decoding import lm_eval_generates
from helpers.serve import assert_refused, streamed_commit_events

BENCH_DATA = __import__("pathlib").Path(__file__).parent / "data" / "bench"
MESSAGES = [{"role": "user", "content": "two and two"}]


@pytest.fixture(scope="module")
def fd_dir(tmp_path_factory):
    return write_block_checkpoint(
        tmp_path_factory.mktemp("fdv2cmd"),
        "fastdllm_v2",
        seed=4,
        head_scale=6.0,
        config_overrides={"bd_size": 16},
    )


@pytest.fixture(scope="module")
def fd_lm(fd_dir):
    return caidllm.load(fd_dir, device="cpu", dtype="float32")


def test_cli_generate(fd_dir, capsys):
    for method in ("fastdllm-v2", "vanilla", "cai"):
        sub_block = ["--sub-block", "4"] if method == "fastdllm-v2" else []  # only its policy reads it
        assert (
            main(
                [
                    "generate",
                    "hello",
                    "--model",
                    str(fd_dir),
                    "--method",
                    method,
                    "--gen-length",
                    "32",
                    "--block-length",
                    "16",
                    *sub_block,
                    "--json",
                ]
            )
            == 0
        )
    out = capsys.readouterr().out
    assert out.count('"method": "fastdllm-v2"') == 1 and '"steps_per_block": [' in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sub-block", "5"], "sub_block (5) must divide block_length (16)"),
        (["--cache", "dual"], "cache='dual' does not apply to the block-causal"),
        (["--method", "cai", "--cache", "subblock"], "cache 'subblock' with policy 'cai'"),
        (
            ["--block-length", "8", "--gen-length", "16"],
            "block_length 8 is not one the fastdllm_v2 model decodes with",
        ),
    ],
)
def test_cli_refusals(fd_dir, capsys, args, words):
    argv = [
        "generate",
        "hello",
        "--model",
        str(fd_dir),
        "--method",
        "fastdllm-v2",
        "--gen-length",
        "32",
        "--block-length",
        "16",
        *args,
    ]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1


@pytest.fixture(scope="module")
def server(fd_lm):
    defaults = ServerDefaults(
        model_name="fd", method="fastdllm-v2", gen_length=32, block_length=16, max_gen_length=64
    )
    with LocalServer(create_app(fd_lm, ServerConfig(defaults=defaults, max_batch=4, max_queue=16))) as s:
        yield s


def test_server_answers_as_generate(server, fd_lm):
    want = fd_lm.generate(
        [MESSAGES[0]["content"]], method="fastdllm-v2", gen_length=32, block_length=16, sub_block=4
    )[0].text
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "sub_block": 4}, timeout=120
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"sub_block": 5}, "sub_block", "must divide block_length"),
        ({"cache": "dual"}, "cache", "does not apply to the block-causal"),
    ],
)
def test_server_refusals(server, body, param, words):
    assert_refused(server.url, body, param, words)


def test_commit_events_for_the_live_view(server, fd_lm):
    """The events the live view draws: every answer position once, never a mask, blocks where they lie."""
    prompt_length = len(fd_lm.encode_messages(MESSAGES))
    events = streamed_commit_events(server.url, MESSAGES)
    lead = prompt_length % 16
    assert {e["block_start"] for e in events} <= {b * 16 - lead for b in range(4)}
    assert sorted(e["position"] for e in events) == list(range(32))
    assert all(e["token_id"] != fd_lm.config.mask_id for e in events if "token_id" in e)


def test_bench(fd_dir, tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "bench",
                "--model",
                str(fd_dir),
                "--task",
                "bbh:boolean_expressions",
                "--methods",
                "fastdllm-v2,vanilla,cai",
                "--limit",
                "2",
                "--data-dir",
                str(BENCH_DATA),
                "--out",
                str(out),
                "--gen-length",
                "32",
                "--block-length",
                "16",
                "--batch-size",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["method"] for r in rows] == ["fastdllm-v2", "vanilla", "cai"]
    assert all(r["n"] == 2 and r["errors"] == 0 and r["nfe_mean"] >= 1 for r in rows)


def test_calibrate(fd_lm, tmp_path):
    from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate

    options = CalibrateOptions(
        tasks=["synthetic:boolean_expressions"],
        out=str(tmp_path / "s.json"),
        limit=2,
        budget=2,
        gen_length=32,
        block_length=16,
        progress=False,
    )
    report = run_calibrate(options, lm=fd_lm, log=lambda m: None)
    assert len(report["trials"]) == 2


def test_lm_eval_adapter(fd_dir):
    pytest.importorskip("lm_eval")
    assert lm_eval_generates(fd_dir, method="fastdllm-v2", gen_length=32, block_length=16)
