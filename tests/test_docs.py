"""The documentation: the site builds strictly (mkdocs.yml: a broken link, anchor or page left out of the
nav fails it), the README keeps the two set-up commands first (CI runs the second exactly), and what the
docs name exists: every `caidllm CMD --flag` is a flag of that command, every `caidllm.x.y` imports, every
source file they cite is there."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages checked against the code: the README, every page of the site, and BENCHMARKS.md's commands.
PAGES = [README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(```|~~~)")


def _text_of(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def test_site_builds_strictly(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -e '.[test]' brings it")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    # each warning, and the pages a warning lists ("  - page.md": those left out of the nav)
    output = (result.stdout + result.stderr).splitlines()
    problems = [line for line in output if "WARNING" in line or "Error" in line or line.startswith("  - ")]
    assert result.returncode == 0, (
        "mkdocs build --strict failed (a page not in mkdocs.yml's nav: add it; a link: fix its target):\n"
        + "\n".join(problems or [result.stderr[-4000:]])
    )
    assert (tmp_path / "site" / "reference" / "loading" / "index.html").read_text().count("doc-heading") > 3


def _code_blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_readme_starts_with_the_two_set_up_commands_that_ci_runs():
    text = _text_of(README)
    assert len(text.splitlines()) <= 250, "the README is the front page: move details into a page of docs/"
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[0] == "Set-up", sections
    main_job, tests = _code_blocks(text)[:2]
    assert main_job.endswith('pip install -e . && caidllm generate "not ( True ) and ( True ) is"')
    assert tests.endswith("pip install -e '.[test]' && python -m pytest -q")
    assert tests in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command exactly
    started = _code_blocks(_text_of(ROOT / "docs" / "getting-started.md"))[:2]
    assert started == [main_job, tests], "docs/getting-started.md gives the README's two commands"


# --- command lines: `caidllm CMD ... --flag` --------------------------------------------------------------

COMMAND = re.compile(r"(?<![\w./-])caidllm ([a-z]\w*)\b")  # `caidllm CMD`: a placeholder


def _command_lines(text: str):
    """Each stretch of text that runs a caidllm command: code-block lines (joined over `\\` continuations)
    and inline code spans, the `# comment` after a command dropped."""
    in_block = False
    pending = ""
    for line in text.splitlines():
        if FENCE.match(line):
            in_block = not in_block
            continue
        if in_block:
            line = pending + line
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            yield " ".join(re.sub(r"\s#.*$", "", line).split())
        else:
            yield from re.findall(r"`([^`]*caidllm [^`]*)`", line)


def _flags_by_command() -> dict[str, set[str]]:
    import argparse

    from caidllm.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(parser._option_string_actions) for name, parser in sub.choices.items()}


def _docs_flags():
    """(page, command, flag) for every flag written after `caidllm CMD` in the docs."""
    for page in PAGES:
        for line in _command_lines(_text_of(page)):
            starts = list(COMMAND.finditer(line))
            for i, match in enumerate(starts):
                end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
                segment = re.split(r"&&|;|\|\s", line[match.end() : end])[0]
                for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", segment):
                    yield page, match.group(1), flag


def test_every_command_and_flag_the_docs_name_exists():
    flags = _flags_by_command()
    wrong = set()
    for page, command, flag in _docs_flags():
        where = page.relative_to(ROOT).as_posix()
        if command not in flags:
            wrong.add(f"{where}: caidllm {command} (no such command; they are {', '.join(sorted(flags))})")
        elif flag not in flags[command]:
            wrong.add(f"{where}: caidllm {command} {flag}")
    assert not wrong, "the docs name flags the commands do not have:\n" + "\n".join(sorted(wrong))


def test_the_flag_scanner_reads_blocks_continuations_and_inline_code():
    text = (
        "```bash\ncaidllm bench --model tiny \\\n    --limit 4 --out x   # --not-a-flag\n```\n"
        "Run `caidllm serve --port 1` and `caidllm models --plan X --tp 2`; `--cache` alone is no command.\n"
    )
    lines = list(_command_lines(text))
    assert lines == [
        "caidllm bench --model tiny --limit 4 --out x",
        "caidllm serve --port 1",
        "caidllm models --plan X --tp 2",
    ]


# --- Python names: `caidllm.x.y` ------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w/.-])caidllm(?:\.[A-Za-z_]\w*)+")


def _resolve(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_python_name_the_docs_give_imports():
    wrong = set()
    for page in PAGES:
        for name in set(DOTTED.findall(_text_of(page))):
            if not name.endswith((".py", ".md", ".json", ".cpp")) and not _resolve(name):  # a file's name
                wrong.add(f"{page.relative_to(ROOT).as_posix()}: {name}")
    assert not wrong, "the docs name Python objects that do not exist:\n" + "\n".join(sorted(wrong))


# --- calls: `lm.forward(..., real_from=...)`, `Engine(lm, max_batch=8)` ------------------------------------

CALL = re.compile(r"\b(caidllm|lm|DiffusionLM|engine|Engine|BackgroundEngine)(?:\.(\w+))?\(([^()]*)\)")


def _callables() -> dict:
    import caidllm
    from caidllm.decode.background import BackgroundEngine
    from caidllm.decode.engine import Engine
    from caidllm.models.lm import DiffusionLM

    return {
        "caidllm": caidllm,
        "lm": DiffusionLM,
        "DiffusionLM": DiffusionLM,
        "engine": Engine,
        "Engine": Engine,
        "BackgroundEngine": BackgroundEngine,
    }


def _takes(function, keyword: str) -> bool:
    import inspect

    parameters = inspect.signature(function).parameters.values()
    return any(p.name == keyword or p.kind is p.VAR_KEYWORD for p in parameters)


def test_every_method_and_keyword_the_docs_call_exists():
    """`DiffusionLM.forward(attention_block=...)` outlived its keyword once: a call the docs write names
    a method of that object and keywords its signature takes."""
    owners = _callables()
    wrong = set()
    for page in PAGES:
        for owner, method, arguments in CALL.findall(_text_of(page)):
            where = (
                f"{page.relative_to(ROOT).as_posix()}: {owner}{'.' + method if method else ''}({arguments})"
            )
            target = getattr(owners[owner], method, None) if method else owners[owner]
            if target is None:
                wrong.add(where)
                continue
            # "random:x?n_layers=4" holds no keyword
            unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", '""', arguments)
            for keyword in re.findall(r"(?<![\w.])(\w+)=(?!=)", unquoted):
                if callable(target) and not _takes(target, keyword):
                    wrong.add(f"{where}: no keyword {keyword}")
    assert not wrong, "the docs call methods or keywords that do not exist:\n" + "\n".join(sorted(wrong))


# --- source files: `models/layers.py`, `tests/test_x.py` ------------------------------------------------

SOURCE = re.compile(r"`((?:[\w.-]+/)+[\w*.-]+\.(?:py|cpp|sh|json|yaml|md))(?::[^`]*)?`")
PACKAGE = ROOT / "src" / "caidllm"
# Paths are cited from the repository root, from src/ or from inside the package (`models/layers.py`);
# a path under another first folder is another project's file (decoder-fidelity.md cites the official code).
BASES = {
    "src": ROOT,
    "tests": ROOT,
    "benchmarks": ROOT,
    "training": ROOT,
    "docs": ROOT,
    ".ci": ROOT,
    "caidllm": ROOT / "src",
    **{p.name: PACKAGE for p in PACKAGE.iterdir() if p.is_dir()},
}


def test_every_source_file_the_docs_cite_exists():
    wrong = set()
    for page in PAGES:
        for path in set(SOURCE.findall(_text_of(page))):
            base = BASES.get(path.split("/")[0])
            if base is not None and not any(base.glob(path)):
                wrong.add(f"{page.relative_to(ROOT).as_posix()}: {path}")
    assert not wrong, "the docs cite files that are not in the repository:\n" + "\n".join(sorted(wrong))


# --- BENCHMARKS.md's contents ---------------------------------------------------------------------------


def test_benchmarks_contents_lists_every_section():
    text = _text_of(ROOT / "BENCHMARKS.md")
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"- \[(.+)\]\(#", contents))
    headings, fenced = [], False
    for line in text.splitlines():
        fenced ^= bool(FENCE.match(line))
        heading = re.match(r"^#{2,3} (.+)$", line)
        if heading and not fenced and heading.group(1) != "Contents":
            headings.append(heading.group(1))
    missing = [h for h in headings if h not in listed]
    assert not missing, (
        "add these sections to BENCHMARKS.md's contents (the site checks the anchors):\n" + "\n".join(missing)
    )
