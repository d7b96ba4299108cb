"""The architecture pages (docs/architecture/add-a-*.md) are worked examples the suite runs: a `python`
block whose first line names a file ("# src/...") is that file's whole text, one whose first line is
"# in <file>" is a line of it; every other block runs, in order, in one namespace per page."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["add-a-decoder.md", "add-a-cache-mode.md", "add-a-model-family.md"]


def python_blocks(page: str) -> list[str]:
    return re.findall(
        r"^```python\n(.*?)^```", (ROOT / "docs" / "architecture" / page).read_text(), re.S | re.M
    )


@pytest.mark.parametrize("page", PAGES)
def test_the_page_shows_the_code_as_it_is_and_its_examples_run(page):
    blocks = python_blocks(page)
    ran = 0
    namespace: dict = {}
    for block in blocks:
        first, _, body = block.partition("\n")
        if first.startswith("# in "):
            assert body.strip("\n") in (ROOT / first[len("# in ") :]).read_text(), (
                f"{page}: {first} shows another line"
            )
        elif first.startswith("# src/"):
            assert body == (ROOT / first[2:]).read_text(), f"{page}: {first[2:]} changed; update the page"
        else:
            exec(compile(block, f"docs/architecture/{page}", "exec"), namespace)
            ran += 1
    assert ran >= 1  # every page has an example that runs
