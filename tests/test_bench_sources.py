"""Where the benchmark records come from: the data folder, or (without one)
the Hugging Face hub copies, mapped to the same records. Offline: hub rows
are written here in the hub's layout and handed to the loaders in place of
`datasets`; the real `datasets` call is checked in offline mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from caidllm.bench.tasks import load_task, reads_data_folder, sources
from caidllm.cli import main
from caidllm.errors import InputError

SRC = Path(__file__).resolve().parents[1] / "src"

# One row of each task as its hub copy gives it (every column of the hub's layout).
HUB_ROWS = {
    "gsm8k": {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    "mbpp": {
        "task_id": 11,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    "piqa": {
        "goal": "Dry wet hands",
        "sol1": "Use a towel.",
        "sol2": "Use a sponge full of water.",
        "label": 0,
    },
    "winogrande": {
        "sentence": "The cup fell off the table because _ was too close to the edge.",
        "option1": "the cup",
        "option2": "the table",
        "answer": "1",
    },
    "bbh:boolean_expressions": {"input": "not ( True ) and ( True ) is", "target": "False"},
    "mathqa": {
        "Problem": "what is 10 % of 300 ?",
        "Rationale": "10 / 100 * 300 = 30",
        "options": "a ) 30 , b ) 40 , c ) 45 , d ) 50 , e ) 90",
        "correct": "a",
        "annotated_formula": "",
        "linear_formula": "",
        "category": "gain",
    },
    "longbench:qmsum": {
        "input": "What did the group decide?",
        "context": "A long transcript ...",
        "answers": ["They chose the red design."],
        "length": 5,
        "dataset": "qmsum",
        "language": "en",
        "all_classes": None,
        "_id": "x1",
    },
    "longbench:narrativeqa": {
        "question": "Where is the key?",
        "context": "A story about a key under a tree.",
        "answers": ["under the tree"],
        "length": 7,
        "dataset": "narrativeqa",
        "language": "en",
        "all_classes": None,
        "_id": "x2",
    },
}
# The same benchmark record as the data folder holds it.
LOCAL = {
    "gsm8k": ("gsm8k/test.jsonl", HUB_ROWS["gsm8k"]),
    "mbpp": ("mbpp/test.jsonl", HUB_ROWS["mbpp"]),
    "piqa": ("piqa/validation.jsonl", HUB_ROWS["piqa"]),
    "winogrande": ("winogrande/validation.jsonl", HUB_ROWS["winogrande"]),
    "mathqa": ("mathqa/test.jsonl", HUB_ROWS["mathqa"]),
    "longbench:qmsum": ("longbench/qmsum.jsonl", HUB_ROWS["longbench:qmsum"]),
    "longbench:narrativeqa": (
        "longbench/narrativeqa.jsonl",
        {
            "input": "Where is the key?",
            "context": "A story about a key under a tree.",
            "answers": ["under the tree"],
        },
    ),
}


@pytest.fixture
def hub(monkeypatch):
    """Replace the `datasets` call: hub[(path, config, split)] = rows; records every call."""
    tables, calls = {}, []

    def fake_rows(source):
        calls.append((source.path, source.config, source.split))
        key = (source.path, source.config, source.split)
        if key not in tables:
            raise ConnectionError(f"Couldn't reach '{source.path}' on the Hub (OfflineModeIsEnabled)")
        return [dict(row) for row in tables[key]]

    monkeypatch.setattr(sources, "hub_rows", fake_rows)
    return tables, calls


def write_local(folder: Path, spec: str):
    relative, record = LOCAL[spec]
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")


def prompts_and_references(task):
    return [(s.prompt, json.loads(json.dumps(s.reference))) for s in task.samples]


@pytest.mark.parametrize(
    "spec, hub_id",
    [
        ("gsm8k", ("openai/gsm8k", "main", "test")),
        ("mbpp", ("google-research-datasets/mbpp", "full", "test")),
        ("piqa", ("baber/piqa", None, "validation")),
        ("winogrande", ("allenai/winogrande", "winogrande_xl", "validation")),
        ("mathqa", ("regisss/math_qa", None, "test")),
        ("longbench:qmsum", ("Xnhyacinth/LongBench", "qmsum", "test")),
        ("longbench:narrativeqa", ("Xnhyacinth/LongBench", "narrativeqa", "test")),
    ],
)
def test_a_hub_row_becomes_the_same_sample_as_the_local_record(tmp_path, hub, spec, hub_id):
    tables, calls = hub
    tables[hub_id] = [HUB_ROWS[spec]]
    from_hub = load_task(spec, data_dir=None)
    assert calls == [hub_id]
    write_local(tmp_path, spec)
    from_file = load_task(spec, data_dir=tmp_path)
    assert len(calls) == 1  # a data folder is never bypassed for the hub
    assert prompts_and_references(from_hub) == prompts_and_references(from_file)
    assert from_hub.metric == from_file.metric
    assert from_hub.source.startswith(f"hub dataset {hub_id[0]}") and from_file.source.endswith(
        LOCAL[spec][0]
    )
    text = {
        "gsm8k": "The answer is 7.",
        "piqa": "The answer is 1.",
        "winogrande": "The answer is 1.",
        "mathqa": "The answer is a.",
        "longbench:qmsum": "They chose the red design.",
        "longbench:narrativeqa": "under the tree",
    }.get(spec)
    if text is not None:  # the same scorer, and it scores the hub sample right
        assert from_hub.score(text, from_hub.samples[0]).score == 1.0


def test_bbh_hub_rows_are_the_examples_of_the_local_file(tmp_path, hub):
    tables, calls = hub
    second = {"input": "True and False is", "target": "False"}
    tables[("SaylorTwift/bbh", "boolean_expressions", "test")] = [HUB_ROWS["bbh:boolean_expressions"], second]
    from_hub = load_task("bbh:boolean_expressions", data_dir=None, fewshot=1)
    (tmp_path / "bbh").mkdir()
    (tmp_path / "bbh" / "boolean_expressions.json").write_text(
        json.dumps({"examples": [HUB_ROWS["bbh:boolean_expressions"], second]})
    )
    from_file = load_task("bbh:boolean_expressions", data_dir=tmp_path, fewshot=1)
    assert prompts_and_references(from_hub) == prompts_and_references(from_file)
    assert "So the answer is False." in from_hub.samples[0].prompt  # the first row is the shot


def test_named_longbench_tasks_take_their_metric_from_the_name(tmp_path):
    (tmp_path / "longbench").mkdir()
    record = {"input": "", "context": "The report says the budget grew.", "answers": ["The budget grew."]}
    for name in ("gov_report", "multifieldqa_en"):
        (tmp_path / "longbench" / f"{name}.jsonl").write_text(json.dumps(record) + "\n")
    assert load_task("longbench:gov_report", data_dir=tmp_path).metric == "rougeL"
    assert load_task("longbench:multifieldqa_en", data_dir=tmp_path).metric == "f1"


def test_a_hub_row_missing_a_field_names_the_dataset_and_row(hub):
    tables, _ = hub
    tables[("openai/gsm8k", "main", "test")] = [HUB_ROWS["gsm8k"], {"question": "no answer here"}]
    with pytest.raises(
        InputError, match=r"gsm8k: hub dataset openai/gsm8k .* line 2 lacks field\(s\) 'answer'"
    ):
        load_task("gsm8k", data_dir=None)


def test_offline_without_a_data_folder_says_which_layout_to_provide(hub):
    for spec, layout in (
        ("gsm8k", "DIR/gsm8k/test.jsonl"),
        ("bbh:web_of_lies", "DIR/bbh/web_of_lies.json"),
        ("longbench:gov_report", "DIR/longbench/gov_report.jsonl"),
        ("mathqa", "DIR/mathqa/test.jsonl"),
    ):
        with pytest.raises(InputError) as error:
            load_task(spec, data_dir=None)
        message = str(error.value)
        assert layout in message and "--data-dir DIR" in message and "CAIDLLM_DATA_DIR" in message
        assert "OfflineModeIsEnabled" in message


def test_the_real_datasets_call_offline_fails_with_the_same_message(tmp_path):
    # A fresh process with an empty Hugging Face cache in offline mode: `datasets` itself answers.
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(SRC),
        "OMP_NUM_THREADS": "1",
    }
    code = (
        "from caidllm.bench.tasks import load_task\n"
        "from caidllm.errors import InputError\n"
        "try:\n    load_task('winogrande')\nexcept InputError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "DIR/winogrande/validation.jsonl" in out.stdout and "allenai/winogrande" in out.stdout, out.stderr[
        -800:
    ]


def test_bench_without_a_data_folder_uses_the_hub_and_fails_in_one_line(monkeypatch, hub, capsys, llada_dir):
    import caidllm.bench.cli as bench_cli

    monkeypatch.setattr(bench_cli, "default_data_dir", lambda: None)
    assert main(["bench", "--model", str(llada_dir), "--task", "piqa", "--methods", "vanilla"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "DIR/piqa/validation.jsonl" in err and "--data-dir" in err
    assert hub[1] == [("baber/piqa", None, "validation")]


def test_which_tasks_read_the_data_folder():
    for spec in ("gsm8k", "bbh:x", "mbpp", "piqa", "winogrande", "mathqa", "longbench:qmsum"):
        assert reads_data_folder(spec), spec
    for spec in ("humaneval", "synthetic:arithmetic", "mathqa:my.jsonl", "longbench:my.jsonl"):
        assert not reads_data_folder(spec), spec
    with pytest.raises(InputError, match="unknown task 'mathqa:'"):
        load_task("mathqa:")
