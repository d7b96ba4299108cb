"""Block-diffusion models through the commands: `caidllm generate` refuses a setting the family does
not take (exit 2, one line naming it); the server answers block-diffusion requests, refuses such a
setting with HTTP 400 naming it, and what else is in flight is unharmed."""

import asyncio

import httpx
import pytest

import caidllm
from caidllm.cli import main
from caidllm.serve.app import ServeSettings, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults

BLOCK_CAUSAL = {"caidllm_block_causal": True, "caidllm_block_lengths": [4, 8]}


@pytest.fixture(scope="module")
def bd_dir(random_checkpoint):
    return random_checkpoint("llada", config_overrides=BLOCK_CAUSAL, seed=7)


@pytest.fixture(scope="module")
def bd_lm(bd_dir):
    return caidllm.load(bd_dir, device="cpu", dtype="float32")


def test_cli_generate_runs_the_family_presets(bd_dir, capsys):
    for method in ("llada2", "sdar", "cai", "vanilla"):
        assert main(["generate", "hello", "--model", str(bd_dir), "--method", method, "--gen-length", "8",
                     "--block-length", "4" if method == "sdar" else "8"]) == 0
    # No --block-length: cai's default (64) is not one this model decodes with, so the model's own (4) runs.
    assert main(["generate", "hello", "--model", str(bd_dir), "--method", "cai", "--gen-length", "64"]) == 0
    assert capsys.readouterr().out.count("forward passes") == 5


@pytest.mark.parametrize("args, words", [
    (["--cache", "dual"], "cache='dual' does not apply to the block-causal"),
    (["--block-length", "16", "--gen-length", "16"], "block_length 16 is not one"),
    (["--method", "llada2.1", "--editing-threshold", "1.5"], "editing_threshold must be in [0, 1]"),
    (["--method", "llada2.1", "--max-post-steps", "-1"], "max_post_steps"),
])
def test_cli_refusals(bd_dir, capsys, args, words):
    code = main(["generate", "hello", "--model", str(bd_dir), "--gen-length", "8", "--block-length", "8", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1


def test_cli_refuses_block_decoders_on_full_sequence_models(llada_dir, capsys):
    assert main(["generate", "hello", "--model", str(llada_dir), "--method", "llada2", "--gen-length", "8",
                 "--block-length", "8"]) == 2
    assert "block-diffusion decoder" in capsys.readouterr().err


@pytest.fixture(scope="module")
def server(bd_lm):
    defaults = ServerDefaults(model_name="bd", method="llada2", gen_length=16, block_length=8, max_gen_length=64)
    with LocalServer(create_app(bd_lm, ServeSettings(defaults=defaults, max_batch=4, max_queue=16))) as s:
        yield s


MESSAGES = [{"role": "user", "content": "two and two"}]


@pytest.mark.parametrize("body, param, words", [
    ({"cache": "dual"}, "cache", "does not apply to the block-causal"),
    ({"block_length": 16, "gen_length": 16}, "block_length", "is not one the llada model decodes with"),
    ({"method": "llada2.1", "editing_threshold": 2}, "editing_threshold", "must be in [0, 1]"),
    ({"method": "cai", "refresh_every": 2}, "refresh_every", "does not apply"),
])
def test_server_refusals(server, body, param, words):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_server_answers_as_generate_while_bad_requests_come_and_go(server, bd_lm):
    """Good requests in flight with bad ones beside them answer as generate() alone would."""
    want = {m: bd_lm.generate([MESSAGES[0]["content"]], method=m, gen_length=16, block_length=8)[0].text
            for m in ("llada2", "llada2.1")}

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            good = [client.post("/v1/chat/completions", json={"messages": MESSAGES, "method": m})
                    for m in ("llada2", "llada2.1", "llada2")]
            bad = [client.post("/v1/chat/completions", json={"messages": MESSAGES, "cache": "prefix"})]
            return await asyncio.gather(*good, *bad)

    *good, bad = asyncio.run(burst())
    assert bad.status_code == 400
    texts = [r.json()["choices"][0]["message"]["content"] for r in good]
    assert texts == [want["llada2"], want["llada2.1"], want["llada2"]]


def test_server_streams_block_diffusion_text(server, bd_lm):
    want = bd_lm.generate([MESSAGES[0]["content"]], method="llada2.1-speed", gen_length=16, block_length=8)[0].text
    text = ""
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=120,
                      json={"messages": MESSAGES, "method": "llada2.1-speed", "stream": True}) as r:
        import json
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert text == want
