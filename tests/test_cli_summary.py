"""`caidllm generate`'s summary line stays one short line: the blocks decoded and their mean and largest
step counts, not the whole steps-per-block list (64 entries, mostly zeros, for tiny-bd's blocks of 4);
`--verbose` adds the list and `--json` always carries it."""

import json

from caidllm.cli import main as cli_main
from caidllm.cli import steps_summary

PROMPT = "not ( True ) and ( True ) is"


def test_steps_summary_counts_the_blocks_that_ran():
    assert steps_summary([1, 1, 2, 0, 0, 0]) == "3 of 6 blocks decoded, steps per block mean 1.3, max 2"
    assert steps_summary([64, 0, 0, 0]) == "1 of 4 blocks decoded, steps per block mean 64.0, max 64"
    assert steps_summary([0, 0]) == "0 of 2 blocks decoded"


def test_generate_prints_a_short_summary_and_the_list_only_when_verbose(capsys):
    args = ["generate", PROMPT, "--model", "tiny-bd", "--gen-length", "128", "--block-length", "4"]
    assert cli_main(args) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("[cai: ") and " blocks decoded, steps per block mean " in summary
    assert "[" not in summary[1:] and len(summary) < 120, summary  # no list in it

    assert cli_main(args + ["--verbose"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("[cai: ")
    full = json.loads(lines[-1].removeprefix("[steps per block: ").removesuffix("]"))
    # 33 blocks here for 32 of gen-length: the first holds the prompt's end too
    assert len(full) >= 32 and steps_summary(full) in lines[-2]

    assert cli_main(args + ["--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["steps_per_block"] == full  # the same decode: tokens and steps are deterministic
