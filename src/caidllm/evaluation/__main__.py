"""``python -m caidllm.evaluation`` / ``caidllm-lm-eval``: lm-eval's command
line with the ``caidllm`` model registered and this package's offline task
configs on the include path (unless --include_path is given). Arguments are
lm-eval's (``lm-eval run --help``)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from caidllm.evaluation import TASKS_DIR


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if importlib.util.find_spec("lm_eval") is None:
        print(
            "caidllm-lm-eval: error: lm-eval is not installed; pip install 'caidllm[eval]'", file=sys.stderr
        )
        return 2
    from caidllm.evaluation import lm_eval_adapter

    if _option(argv, "--include_path") is None and argv and argv[0] not in ("-h", "--help"):
        argv += ["--include_path", str(TASKS_DIR)]
    output = _option(argv, "--output_path") or _option(argv, "-o")
    if output and not os.environ.get(lm_eval_adapter.STATS_ENV):
        folder = Path(output)
        folder = folder.parent if folder.suffix == ".json" else folder
        os.environ[lm_eval_adapter.STATS_ENV] = str(folder / "caidllm_stats.json")
    from lm_eval.__main__ import cli_evaluate

    from caidllm.errors import InputError

    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except InputError as error:  # a bad model_args value: one line naming it, no traceback
        print(f"caidllm-lm-eval: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
