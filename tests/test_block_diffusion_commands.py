"""Block-diffusion models through the commands: `caidllm generate` refuses a setting the family does
not take (exit 2, one line naming it); the server answers block-diffusion requests, refuses such a
setting with HTTP 400 naming it, and what else is in flight is unharmed."""

import asyncio

import httpx
import pytest

import caidllm
from caidllm.cli import main
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults
from helpers.decoding import lm_eval_generates
from helpers.serve import assert_refused, streamed_commit_events

BLOCK_CAUSAL = {"caidllm_block_causal": True, "caidllm_block_lengths": [4, 8]}


@pytest.fixture(scope="module")
def bd_dir(random_checkpoint):
    return random_checkpoint("llada", config_overrides=BLOCK_CAUSAL, seed=7)


@pytest.fixture(scope="module")
def bd_lm(bd_dir):
    return caidllm.load(bd_dir, device="cpu", dtype="float32")


def test_cli_generate_runs_the_family_presets(bd_dir, capsys):
    assert (
        main(
            [
                "generate",
                "hello",
                "--model",
                str(bd_dir),
                "--method",
                "llada2",
                "--gen-length",
                "8",
                "--block-length",
                "8",
            ]
        )
        == 0
    )
    # No --block-length: cai's default (64) is not one this model decodes with, so the model's own (4) runs.
    assert (
        main(["generate", "hello", "--model", str(bd_dir), "--method", "cai", "--gen-length", "64", "--json"])
        == 0
    )
    out = capsys.readouterr().out
    assert "forward passes" in out and '"steps_per_block": [' in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--cache", "dual"], "cache='dual' does not apply to the block-causal"),
        (["--block-length", "16", "--gen-length", "16"], "block_length 16 is not one"),
        (["--method", "llada2.1", "--editing-threshold", "1.5"], "editing_threshold must be in [0, 1]"),
        (["--method", "llada2.1", "--max-post-steps", "-1"], "max_post_steps"),
    ],
)
def test_cli_refusals(bd_dir, capsys, args, words):
    code = main(
        ["generate", "hello", "--model", str(bd_dir), "--gen-length", "8", "--block-length", "8", *args]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1


def test_cli_refuses_block_decoders_on_full_sequence_models(llada_dir, capsys):
    assert (
        main(
            [
                "generate",
                "hello",
                "--model",
                str(llada_dir),
                "--method",
                "llada2",
                "--gen-length",
                "8",
                "--block-length",
                "8",
            ]
        )
        == 2
    )
    assert "block-diffusion decoder" in capsys.readouterr().err


@pytest.fixture(scope="module")
def server(bd_lm):
    defaults = ServerDefaults(
        model_name="bd", method="llada2", gen_length=16, block_length=8, max_gen_length=64
    )
    with LocalServer(create_app(bd_lm, ServerConfig(defaults=defaults, max_batch=4, max_queue=16))) as s:
        yield s


MESSAGES = [{"role": "user", "content": "two and two"}]


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"cache": "dual"}, "cache", "does not apply to the block-causal"),
        ({"block_length": 16, "gen_length": 16}, "block_length", "is not one the llada model decodes with"),
        ({"method": "llada2.1", "editing_threshold": 2}, "editing_threshold", "must be in [0, 1]"),
        ({"method": "cai", "refresh_every": 2}, "refresh_every", "does not apply"),
    ],
)
def test_server_refusals(server, body, param, words):
    assert_refused(server.url, body, param, words)


def test_server_answers_as_generate_while_bad_requests_come_and_go(server, bd_lm):
    """Good requests in flight with bad ones beside them answer as generate() alone would."""
    want = {
        m: bd_lm.generate([MESSAGES[0]["content"]], method=m, gen_length=16, block_length=8)[0].text
        for m in ("llada2", "llada2.1")
    }

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            good = [
                client.post("/v1/chat/completions", json={"messages": MESSAGES, "method": m})
                for m in ("llada2", "llada2.1", "llada2")
            ]
            bad = [client.post("/v1/chat/completions", json={"messages": MESSAGES, "cache": "prefix"})]
            return await asyncio.gather(*good, *bad)

    *good, bad = asyncio.run(burst())
    assert bad.status_code == 400
    texts = [r.json()["choices"][0]["message"]["content"] for r in good]
    assert texts == [want["llada2"], want["llada2.1"], want["llada2"]]


def test_server_streams_block_diffusion_text(server, bd_lm):
    want = bd_lm.generate([MESSAGES[0]["content"]], method="llada2.1-speed", gen_length=16, block_length=8)[
        0
    ].text
    text = ""
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        timeout=120,
        json={"messages": MESSAGES, "method": "llada2.1-speed", "stream": True},
    ) as r:
        import json

        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert text == want


def test_commit_events_say_where_a_block_starts(server, bd_lm):
    """The live view draws blocks as they are: the first block of a block-diffusion answer is part
    prompt (block_start < 0), the others start block_length apart."""
    prompt_length = len(bd_lm.encode_messages(MESSAGES))
    events = streamed_commit_events(server.url, MESSAGES)
    lead = prompt_length % 8
    assert {(e["block"], e["block_start"]) for e in events} == {
        (b, b * 8 - lead) for b in range(len({e["block"] for e in events}))
    }
    assert sorted(e["position"] for e in events) == list(range(16))


BENCH_DATA = __import__("pathlib").Path(__file__).parent / "data" / "bench"


def test_bench_runs_every_family_decoder(bd_dir, tmp_path):
    import json

    out = tmp_path / "run"
    assert (
        main(
            [
                "bench",
                "--model",
                str(bd_dir),
                "--task",
                "bbh:boolean_expressions",
                "--methods",
                "llada2,sdar,cai",
                "--limit",
                "2",
                "--data-dir",
                str(BENCH_DATA),
                "--out",
                str(out),
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--batch-size",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["method"] for r in rows] == ["llada2", "sdar", "cai"]
    assert all(r["n"] == 2 and r["errors"] == 0 and r["nfe_mean"] >= 1 for r in rows)


def test_bench_refuses_a_block_decoder_on_a_full_sequence_model(llada_dir, tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "--model",
                str(llada_dir),
                "--task",
                "bbh:boolean_expressions",
                "--methods",
                "llada2",
                "--limit",
                "2",
                "--data-dir",
                str(BENCH_DATA),
                "--out",
                str(tmp_path / "r"),
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--no-progress",
            ]
        )
        == 2
    )
    assert "block-diffusion decoder" in capsys.readouterr().err


def test_calibrate_runs_on_a_block_diffusion_model(bd_lm, tmp_path):
    from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate

    options = CalibrateOptions(
        tasks=["synthetic:boolean_expressions"],
        out=str(tmp_path / "s.json"),
        limit=2,
        budget=2,
        gen_length=16,
        block_length=8,
        progress=False,
    )
    report = run_calibrate(options, lm=bd_lm, log=lambda m: None)
    assert len(report["trials"]) == 2 and report["trials"][0].label == "start"


def test_lm_eval_adapter_on_a_block_diffusion_model(bd_dir):
    pytest.importorskip("lm_eval")
    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    assert lm_eval_generates(bd_dir, method="llada2", gen_length=16, block_length=8)
    with pytest.raises(Exception, match="cache='dual' does not apply"):
        CaidllmLM(
            pretrained=str(bd_dir), method="cai", cache="dual", gen_length=16, block_length=8, device="cpu"
        )


def test_compiled_block_diffusion_gives_the_same_tokens(bd_dir, bd_lm):
    compiled = caidllm.load(bd_dir, device="cpu", dtype="float32", compile=True)
    want = bd_lm.generate(["two and two"], method="llada2.1", gen_length=8, block_length=8)
    got = compiled.generate(["two and two"], method="llada2.1", gen_length=8, block_length=8)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
