"""The shipped tiny model does the README's main job: a correct worked answer.

(Its chains on the harder tasks are not always right yet: see MODEL_CARD.md.)"""

import pytest

import caidllm
from caidllm.cli import main as cli_main
from caidllm.tasks import score

MAIN_JOB = "not ( True ) and ( True ) is"
# The worked answer of the task generator: one reduction per line.
MAIN_JOB_CHAIN = """not ( True ) and ( True )
= not True and ( True )
= not True and True
= False and True
= False
So the answer is False."""


@pytest.fixture(scope="module")
def tiny():
    return caidllm.load("tiny", device="cpu")


def test_main_job_prints_a_correct_worked_answer(capsys):
    assert cli_main(["generate", MAIN_JOB]) == 0  # no flags: the default model and method
    assert capsys.readouterr().out.startswith(MAIN_JOB_CHAIN + "\n")


@pytest.mark.parametrize("method", ["vanilla", "cai"])  # the reference decoder and the default
def test_tiny_answers_the_issue_examples(tiny, method):
    prompts = [
        MAIN_JOB,
        "Question: Sherrie tells the truth. Vernell says Sherrie tells the truth. Alexis says "
        "Vernell lies. Michaela says Alexis tells the truth. Elanor says Michaela tells the truth. "
        "Does Elanor tell the truth?",
    ]
    boolean, web = tiny.generate(prompts, method=method)
    assert score("boolean_expressions", boolean.text, "False") and not score(
        "boolean_expressions", boolean.text, "True"
    )
    assert score("web_of_lies", web.text, "No") and not score("web_of_lies", web.text, "Yes")
