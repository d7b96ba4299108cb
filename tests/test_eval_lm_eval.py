"""The lm-eval adapter: the `caidllm` model answers generate_until requests
(chat template, stop strings, statistics), refuses likelihood requests
clearly, and lm-eval runs end to end offline on a local task."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from caidllm.evaluation import TASKS_DIR  # noqa: E402
from caidllm.evaluation.lm_eval_adapter import CaidllmLM, cut_at_stop  # noqa: E402

BENCH = Path(__file__).parent / "data" / "bench"


def _request(context, until=(), i=0, **gen_kwargs):
    return Instance(
        request_type="generate_until",
        doc={},
        arguments=(context, {"until": list(until), **gen_kwargs}),
        idx=i,
    )


@pytest.fixture(scope="module")
def adapter(llada_dir, tmp_path_factory):
    stats = tmp_path_factory.mktemp("stats") / "stats.json"
    return CaidllmLM(
        pretrained=str(llada_dir),
        method="cai",
        gen_length=16,
        block_length=8,
        batch_size=2,
        device="cpu",
        stats_path=str(stats),
    )


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    assert get_model("caidllm") is CaidllmLM


def test_generate_until_answers_every_request_and_writes_statistics(adapter):
    requests = [_request("What is 2 + 2?", i=0), _request("Name a colour.", i=1), _request("Say yes.", i=2)]
    answers = adapter.generate_until(requests)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    stats = json.loads(adapter.stats_path.read_text())
    assert stats["requests"] == 3 and stats["method"] == "cai"
    assert stats["nfe_mean"] >= 1 and len(stats["steps_per_block"]) == 2 and stats["tps_positions"] > 0


def test_stop_strings_cut_the_answer(adapter):
    assert cut_at_stop("abc\n\nQuestion: more", ["Question:", "\n\n"]) == "abc"
    assert cut_at_stop("abc", []) == "abc"
    plain = adapter.generate_until([_request("Hello there")])[0]
    if len(plain) > 2:
        stop = plain[1:3]
        assert adapter.generate_until([_request("Hello there", until=[stop])])[0] == plain[: plain.find(stop)]


def test_chat_template_applied_to_plain_text_only(adapter):
    plain = adapter._encode("Hello")
    assert plain == adapter.lm.encode_chat("Hello")
    templated_text = adapter.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert adapter._templated(templated_text) and not adapter._templated("Hello")
    assert adapter._encode(templated_text) == plain  # not wrapped twice


def test_likelihood_requests_are_refused_clearly(adapter):
    with pytest.raises(NotImplementedError, match="masked diffusion"):
        adapter.loglikelihood([Instance("loglikelihood", {}, ("a", " b"), 0)])
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        adapter.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("a",), 0)])


def test_bad_model_args_are_input_errors(llada_dir):
    from caidllm.errors import InputError

    with pytest.raises(InputError, match="unknown method"):
        CaidllmLM(pretrained=str(llada_dir), method="warp", device="cpu")
    with pytest.raises(InputError, match="chat="):
        CaidllmLM(pretrained=str(llada_dir), chat="maybe", device="cpu")
    with pytest.raises(InputError, match="prefix_cache_mb must be a number of MB >= 0"):
        CaidllmLM(pretrained=str(llada_dir), prefix_cache_mb="-2", device="cpu")
    with pytest.raises(InputError, match="prefix cache does not apply to the llada model"):
        CaidllmLM(pretrained=str(llada_dir), prefix_cache_mb="8", device="cpu")


def test_few_shot_requests_share_their_examples_through_the_prefix_store(tmp_path):
    """tiny-bd: the second batch takes the first's shared examples from the store, with the same answers."""
    shots = "Q: not ( True ) and ( True ) is\nA: False\n\nQ: True and not False is\nA: True\n\n"
    requests = [_request(shots + f"Q: {q} is\nA:", i=i) for i, q in enumerate(["True or False", "not True"])]
    answers = {}
    for budget in ("0", "16"):
        stats = tmp_path / f"stats{budget}.json"
        adapter = CaidllmLM(
            pretrained="tiny-bd",
            method="llada2",
            gen_length=16,
            block_length=8,
            batch_size=1,
            device="cpu",
            dtype="float32",
            chat="false",
            prefix_cache_mb=budget,
            stats_path=str(stats),
        )
        answers[budget] = adapter.generate_until(requests)
        answers[budget + " saved"] = json.loads(stats.read_text())["prefill_saved_share"]
    assert answers["0"] == answers["16"] and answers["0 saved"] == 0 and answers["16 saved"] > 0


def test_lm_eval_end_to_end_offline(llada_dir, tmp_path):
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("CAIDLLM_LM_EVAL_STATS", None)
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "caidllm.evaluation",
        "--model",
        "caidllm",
        "--model_args",
        f"pretrained={llada_dir},method=vanilla,gen_length=16,block_length=8",
        "--tasks",
        "caidllm_gsm8k,caidllm_bbh_boolean_expressions",
        "--metadata",
        json.dumps({"data_dir": str(BENCH)}),
        "--limit",
        "2",
        "--batch_size",
        "2",
        "--device",
        "cpu",
        "--output_path",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    assert set(results) == {"caidllm_gsm8k", "caidllm_bbh_boolean_expressions"}
    assert 0.0 <= results["caidllm_gsm8k"]["exact_match,none"] <= 1.0
    assert "exact_match_flexible,none" in results["caidllm_gsm8k"]
    stats = json.loads((out / "caidllm_stats.json").read_text())
    assert stats["requests"] == 4 and stats["method"] == "vanilla" and stats["nfe_mean"] == 16


def test_task_configs_cover_the_data_folder():
    names = {p.stem for p in TASKS_DIR.rglob("caidllm_*.yaml")}
    assert {
        "caidllm_gsm8k",
        "caidllm_mbpp",
        "caidllm_humaneval",
        "caidllm_piqa",
        "caidllm_winogrande",
        "caidllm_bbh_boolean_expressions",
        "caidllm_synthetic_arithmetic",
    } <= names


def test_dataset_loader_of_the_task_configs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("caidllm_task_utils", TASKS_DIR / "utils.py")
    # the task configs' helper module, loaded by path as lm-eval does
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    data = utils.dataset("bbh:boolean_expressions", data_dir=str(BENCH), version=1.0, pretrained="x")
    doc = data["test"][0]
    assert doc["prompt"] == "not ( True ) and ( True ) is"
    assert utils.process_results(doc, ["So the answer is False."]) == {"exact_match": 1.0}
    assert utils.process_results(doc, ["So the answer is True."]) == {"exact_match": 0.0}


def _per_request_outputs(out: Path) -> dict:
    """(task, doc_id) -> the filtered answer and the first raw answer, from lm-eval's --log_samples files."""
    outputs = {}
    for path in out.rglob("samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        for line in path.read_text().splitlines():
            record = json.loads(line)
            # a rank lm-eval pads with copies of its last request appends their answers to that request's
            # resps
            outputs[task, record["doc_id"]] = (record["filtered_resps"], record["resps"][0][0])
    return outputs


def test_lm_eval_data_parallel_two_ranks_same_answers(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CAIDLLM_LM_EVAL_STATS")
    }
    src = str(Path(__file__).parents[1] / "src")
    env.update(
        {
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")])),
        }
    )
    args = [
        "-m",
        "caidllm.evaluation",
        "--model",
        "caidllm",
        "--model_args",
        "pretrained=tiny,method=cai,gen_length=16,block_length=8",
        "--tasks",
        "caidllm_gsm8k,caidllm_bbh_boolean_expressions",
        "--metadata",
        json.dumps({"data_dir": str(BENCH)}),
        "--limit",
        "3",
        "--batch_size",
        "2",
        "--device",
        "cpu",
        "--log_samples",
    ]
    launchers = {
        "one": [sys.executable],
        "two": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
    }
    outputs, results, stats = {}, {}, {}
    for name, launcher in launchers.items():
        out = tmp_path / name
        done = subprocess.run(
            [*launcher, *args, "--output_path", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[name] = _per_request_outputs(out)
        (results_file,) = out.rglob("results_*.json")
        results[name] = json.loads(results_file.read_text())["results"]
        stats[name] = json.loads((out / "caidllm_stats.json").read_text())
    assert len(outputs["one"]) == 6 and outputs["one"] == outputs["two"]
    for task in ("caidllm_gsm8k", "caidllm_bbh_boolean_expressions"):
        assert results["one"][task]["exact_match,none"] == results["two"][task]["exact_match,none"]
    assert stats["one"]["world_size"] == 1 and stats["two"]["world_size"] == 2
    # split, not repeated: rank 0 has docs 0 and 2 of each task, rank 1 doc 1 of each plus 2 padding copies
    # (lm-eval evens the ranks out); every rank answering everything would make 12
    assert stats["one"]["requests"] == 6 and stats["two"]["requests"] == 8


def test_lm_eval_few_shot_contexts_are_the_layouts_the_trainer_trains(tmp_path, monkeypatch):
    """--num_fewshot K shows each shot with its answer "So the answer is X." (the template's
    fewshot_config), as train/fewshot.py's "plain" (one message) and "turns" (chat turns) rows."""
    from lm_eval.tasks import TaskManager

    from caidllm.train.fewshot import messages

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    manager = TaskManager(
        include_path=str(TASKS_DIR), include_defaults=False, metadata={"data_dir": str(BENCH)}
    )
    task = manager.load("caidllm_bbh_boolean_expressions")["tasks"]["caidllm_bbh_boolean_expressions"]
    task.set_fewshot_seed(1234)
    doc = task.test_docs()[0]
    as_json = lambda m, **_: json.dumps(m)  # noqa: E731
    turns = json.loads(
        task.fewshot_context(
            doc, 2, apply_chat_template=True, fewshot_as_multiturn=True, chat_template=as_json
        )
    )
    shots = [(turns[i]["content"], turns[i + 1]["content"]) for i in (0, 2)]
    assert all(a.startswith("So the answer is ") and a.endswith(".") for _, a in shots)
    assert turns == messages(shots, doc["prompt"], "turns")
    task.set_fewshot_seed(1234)
    one = json.loads(
        task.fewshot_context(
            doc, 2, apply_chat_template=True, fewshot_as_multiturn=False, chat_template=as_json
        )
    )
    assert one == messages(shots, doc["prompt"], "plain")
    task.set_fewshot_seed(1234)
    assert task.fewshot_context(doc, 2) == one[0]["content"]  # without the chat template: the same text
