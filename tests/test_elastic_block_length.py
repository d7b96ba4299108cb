"""Elastic-Cache's official loop (method `elastic`, elastic_scope "generation") decodes the whole
generation as one block: a block length given to it that differs is refused naming the setting and
both ways out (Python API, CLI, serve, lm-eval, a one-method bench), never silently replaced; a default
filled for the caller (a known checkpoint's recommendation, a server's default, a bench's block length
shared with block-wise methods) is not given, and the bench's row and report say the block it ran."""

import json
from pathlib import Path

import httpx
import pytest

import caidllm
from caidllm.cli import build_parser, main
from caidllm.decode import build_config
from caidllm.decode.config import DecodeConfig
from caidllm.decode.engine import Engine
from caidllm.decode.presets import lays_blocks, run_lengths
from caidllm.errors import InputError
from caidllm.serve.launch import settings_from
from helpers.serve import PROMPT, start

REFUSAL = (
    "block_length 8 does not apply to method '{method}': Elastic-Cache's official loop (cache 'elastic', "
    "elastic_scope 'generation') decodes the whole generation (gen_length 16) as one block with its own "
    "sliding window; drop block_length, or use method 'elastic-block' (elastic_scope='block') for blocks of 8"
)
DATA = Path(__file__).parent / "data" / "bench"
BENCH = ["--task", "bbh:boolean_expressions", "--limit", "1", "--batch-size", "1", "--no-progress"]


def test_the_python_api_refuses_a_block_length_it_would_not_use(tiny):
    for method, extra in (("elastic", {}), ("fastdllm", {"cache": "elastic", "refresh_every": 0})):
        with pytest.raises(InputError) as refused:
            tiny.generate([5, 6, 7], method=method, gen_length=16, block_length=8, **extra)
        assert str(refused.value) == REFUSAL.format(method=method)


def test_what_the_loop_reads_runs_as_before(tiny):
    (plain,) = tiny.generate([5, 6, 7], method="elastic", gen_length=16)
    (whole,) = tiny.generate([5, 6, 7], method="elastic", gen_length=16, block_length=16)
    assert len(plain.steps_per_block) == 1 and plain.token_ids == whole.token_ids and plain.nfe == whole.nfe
    for method, extra in (("elastic-block", {}), ("elastic", {"elastic_scope": "block"})):
        (blocks,) = tiny.generate([5, 6, 7], method=method, gen_length=16, block_length=8, **extra)
        assert len(blocks.steps_per_block) == 2


def test_a_hand_built_config_is_held_to_the_same_rule(tiny):
    """A DecodeConfig built by hand (no build_config to record what was given): a setting that differs
    from its default counts as given, so the engine refuses it too instead of replacing it."""
    hand = DecodeConfig(method="elastic", policy="threshold", cache="elastic", gen_length=16, block_length=8)
    assert hand.given == ("block_length", "cache", "gen_length", "policy")
    with pytest.raises(InputError) as refused:
        Engine(tiny).prepare([5, 6, 7], hand)
    assert str(refused.value) == REFUSAL.format(method="elastic")
    plain = DecodeConfig(method="elastic", policy="threshold", cache="elastic", gen_length=16).validate()
    assert plain.block_length == 16 and "block_length" not in plain.given
    assert DecodeConfig().given == () and build_config("elastic", gen_length=16).given == ("gen_length",)


def test_a_bad_block_length_is_named_as_such(tiny):
    with pytest.raises(InputError, match="block_length must be a positive integer, got 0"):
        build_config("elastic", gen_length=16, block_length=0)


def test_a_filled_default_is_not_given():
    assert build_config("elastic", gen_length=16, block_length=8, filled=("block_length",)).block_length == 16
    assert not lays_blocks("elastic") and lays_blocks("elastic-block") and lays_blocks("fastdllm")
    assert not lays_blocks("fastdllm", cache="elastic") and lays_blocks("elastic", elastic_scope="block")
    methods = [("fastdllm", {}), ("elastic", {})]
    assert run_lengths(methods, 16, 8) == [
        dict(gen_length=16, block_length=8),
        dict(gen_length=16, block_length=None),
    ]
    # refused by the decoder
    assert run_lengths([("elastic", {})], 16, 8) == [dict(gen_length=16, block_length=8)]


def test_a_known_checkpoints_recommended_block_is_not_the_callers(random_checkpoint, capsys):
    folder = random_checkpoint("llada", config_overrides={"caidllm_checkpoint": "GSAI-ML/LLaDA-8B-Instruct"})
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    (result,) = lm.generate([5, 6, 7], method="elastic")  # the card: gen_length 128, block_length 32
    assert len(result.token_ids) == 128 and len(result.steps_per_block) == 1
    assert main(["generate", "7 + 5 =", "--model", str(folder), "--method", "elastic", "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["steps_per_block"]) == 1
    assert "recommended settings applied: gen_length 128, steps 128, temperature 0;" in err  # no block_length


def test_the_cli_exits_2_with_one_line_before_loading(monkeypatch, capsys):
    import caidllm.options

    monkeypatch.setattr(
        caidllm.options, "load_model", lambda *a, **k: pytest.fail("loaded before the refusal")
    )
    code = main(
        [
            "generate",
            "hi",
            "--model",
            "tiny",
            "--method",
            "elastic",
            "--gen-length",
            "16",
            "--block-length",
            "8",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err == f"caidllm: error: {REFUSAL.format(method='elastic')}\n"
    assert (
        main(["serve", "--model", "tiny", "--method", "elastic", "--gen-length", "16", "--block-length", "8"])
        == 2
    )
    assert capsys.readouterr().err == f"caidllm: error: {REFUSAL.format(method='elastic')}\n"


def test_serve_refuses_a_clients_block_length_and_keeps_its_own_default(tiny):
    with start(tiny) as server:  # defaults: gen_length 64, block_length 16
        url = f"{server.url}/v1/completions"
        body = {"prompt": PROMPT, "max_tokens": 16, "gen_length": 16, "method": "elastic"}
        refused = httpx.post(url, json={**body, "block_length": 8}, timeout=60)
        assert refused.status_code == 400
        assert refused.json() == {
            "error": {
                "message": REFUSAL.format(method="elastic"),
                "type": "invalid_request_error",
                "param": "block_length",
                "code": None,
            }
        }
        # the server's block 16: not given
        answer = httpx.post(url, json={**body, "gen_length": 32}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["caidllm"]["block_length"] == 32 and answer.json()["caidllm"]["gen_length"] == 32
        blocks = httpx.post(url, json={**body, "method": "elastic-block", "block_length": 8}, timeout=60)
        assert blocks.status_code == 200 and blocks.json()["caidllm"]["block_length"] == 8
        # max_tokens alone: elastic's canvas is exactly max_tokens (one block), its alone answer.
        exact = httpx.post(
            url, json={"prompt": PROMPT, "max_tokens": 10, "method": "elastic"}, timeout=60
        ).json()
        assert (exact["caidllm"]["gen_length"], exact["caidllm"]["block_length"]) == (10, 10)
        (alone,) = tiny.generate([tiny.tokenizer.encode(PROMPT)], method="elastic", gen_length=10)
        assert exact["choices"][0]["text"] == alone.text


def test_a_one_block_methods_canvas_is_max_tokens_not_whole_server_blocks(tiny):
    """The server rounds max_tokens up to its block default for methods that lay blocks; a method that
    decodes the canvas as one block (Elastic-Cache's official loop) gets exactly max_tokens."""
    from caidllm.serve.protocol import ServerDefaults, parse

    defaults = ServerDefaults(model_name="tiny", gen_length=64, block_length=16)
    for body, canvas in (
        ({"method": "elastic"}, 10),
        ({"method": "fastdllm"}, 16),
        ({"method": "elastic-block"}, 16),
        ({"method": "fastdllm", "cache": "elastic", "refresh_every": 0}, 10),
        ({"method": "elastic", "gen_length": 12}, 12),
    ):
        config = parse({"prompt": PROMPT, "max_tokens": 10, **body}, "completion", tiny, defaults).config
        assert config.gen_length == canvas, (body, config.gen_length)
    assert (
        parse({"prompt": PROMPT, "method": "elastic"}, "completion", tiny, defaults).config.gen_length == 64
    )
    for tokens in (1, 2):  # the smallest canvases: one block of 1 or 2 positions, decoded alone = batched
        body = {"prompt": PROMPT, "max_tokens": tokens, "method": "elastic"}
        config = parse(body, "completion", tiny, defaults).config
        assert (config.gen_length, config.block_length) == (tokens, tokens)
        prompts = [tiny.tokenizer.encode(PROMPT), tiny.tokenizer.encode("True or False is")]
        batched = [
            r.token_ids for r in tiny.generate(prompts, method="elastic", gen_length=tokens, batch_size=2)
        ]
        assert batched == [
            tiny.generate([p], method="elastic", gen_length=tokens)[0].token_ids for p in prompts
        ]
        assert all(len(ids) == tokens for ids in batched)


def test_a_server_whose_default_method_is_elastic_keeps_a_block_default_for_the_others(tiny):
    settings = settings_from(
        build_parser().parse_args(["serve", "--model", "tiny", "--method", "elastic"]), tiny
    )
    assert (settings.defaults.gen_length, settings.defaults.block_length) == (256, 64)


def test_an_elastic_servers_gen_length_stays_its_default(tiny):
    """--method elastic --gen-length G: a request that gives no lengths decodes G positions (its block default
    for the block-wise methods divides G, else it is G, as before), not G rounded up to another block."""
    from caidllm.serve.protocol import parse

    for gen in (16, 100, 256):
        args = build_parser().parse_args(
            ["serve", "--model", "tiny", "--method", "elastic", "--gen-length", str(gen)]
        )
        defaults = settings_from(args, tiny).defaults
        assert defaults.gen_length == gen and gen % defaults.block_length == 0
        for body in ({}, {"method": "fastdllm"}):
            config = parse({"prompt": PROMPT, **body}, "completion", tiny, defaults).config
            assert config.gen_length == gen, (gen, body, config.gen_length)


def test_an_elastic_servers_given_block_length_stays_the_others_default(tiny):
    """--method elastic --block-length G (G = gen_length, so elastic takes it): the block-wise methods'
    default is the block the user gave, not another."""
    args = build_parser().parse_args(
        ["serve", "--model", "tiny", "--method", "elastic", "--gen-length", "128", "--block-length", "128"]
    )
    defaults = settings_from(args, tiny).defaults
    assert (defaults.gen_length, defaults.block_length) == (128, 128)


def test_the_lm_eval_adapter_refuses_it():
    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    with pytest.raises(InputError, match="block_length 8 does not apply to method 'elastic'"):
        CaidllmLM(pretrained="tiny", method="elastic", gen_length=16, block_length=8, device="cpu")


def test_a_one_method_bench_refuses_it(capsys):
    assert (
        main(
            [
                "bench",
                "--model",
                "tiny",
                "--methods",
                "elastic",
                "--gen-length",
                "16",
                "--block-length",
                "8",
                *BENCH,
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == f"caidllm: error: {REFUSAL.format(method='elastic')}\n"


def test_a_bench_row_says_elastic_ran_one_block_beside_block_wise_methods(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "bench",
            "--model",
            "tiny",
            "--methods",
            "elastic,fastdllm,elastic-block",
            "--gen-length",
            "16",
            "--block-length",
            "8",
            "--data-dir",
            str(DATA),
            "--out",
            str(out),
            *BENCH,
        ]
    )
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    # the block-wise methods' block, though elastic is listed first
    assert report["settings"]["block_length"] == 8
    rows = {r["method"]: r for r in report["results"]}
    assert {m: r["block_length"] for m, r in rows.items()} == {
        "elastic": 16,
        "fastdllm": 8,
        "elastic-block": 8,
    }
    assert [len(r["steps_per_block"]) for r in rows.values()] == [2, 2, 2]
    assert (
        "Block: `elastic` decodes the whole generation as one block of 16" in (out / "results.md").read_text()
    )
    assert (
        "elastic: Elastic-Cache's official loop decodes the whole generation as one block of 16"
        in capsys.readouterr().err
    )


def test_the_soak_sends_its_block_length_only_to_methods_that_lay_blocks():
    from caidllm.serve.soak import _body_of

    body = {"gen_length": 32, "block_length": 16}
    assert _body_of("elastic", body) == {"gen_length": 32} and _body_of("elastic-block", body) == body
    assert _body_of("warp", body) == body  # an unknown method: the server names it
    with_method = {**body, "method": "fastdllm"}  # a body that names a method too: read, not a TypeError
    assert _body_of("elastic", with_method) == {"gen_length": 32, "method": "fastdllm"}
    for method, scope in (("elastic", {"elastic_scope": "block"}), ("fastdllm", {"cache": "elastic"})):
        own = {**body, **scope}  # the body's own cache and scope decide, as the server's would
        assert _body_of(method, own) == (own if method == "elastic" else {"gen_length": 32, **scope})


def test_the_arrivals_bench_runs_elastic_beside_a_block_wise_method(capsys):
    from caidllm.bench.arrivals import main as arrivals

    assert (
        arrivals(
            [
                "--requests",
                "2",
                "--methods",
                "elastic,fastdllm",
                "--max-batch",
                "2",
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--rate",
                "40",
            ]
        )
        == 0
    )
    assert "| elastic | continuous |" in capsys.readouterr().out
    with pytest.raises(InputError, match="block_length 8 does not apply to method 'elastic'"):
        arrivals(["--requests", "2", "--methods", "elastic", "--gen-length", "16", "--block-length", "8"])
    with pytest.raises(
        InputError, match="block_length must be a positive integer, got 0"
    ):  # not the default's 32
        arrivals(["--requests", "2", "--methods", "fastdllm", "--gen-length", "16", "--block-length", "0"])


def test_whether_a_method_lays_blocks_reads_only_its_cache_and_scope():
    # steps fit only these
    assert lays_blocks("vanilla", steps=6, gen_length=12, block_length=4, temperature=0.5)
    assert not lays_blocks("cai", cache="elastic") and lays_blocks(
        "cai", cache="elastic", elastic_scope="block"
    )
