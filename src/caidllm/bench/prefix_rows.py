"""The prefix store in `caidllm bench` (decode/prefix_reuse.py): one report row per method and budget
(`--prefix-cache-mb 0,256`: each method with the store off, then on, in one run), and a row's prefill
figures (prompt positions computed per request, the share the store saved)."""

from __future__ import annotations

from caidllm.decode.prefix_reuse import check_budget
from caidllm.errors import InputError


def parse_budgets(text: str | None) -> tuple:
    """`--prefix-cache-mb`: one budget or a comma-separated list of them (MB; 0 = off); None: the default."""
    if text is None:
        return (None,)
    parts = [p.strip() for p in str(text).split(",")]
    if not all(parts):
        raise InputError(
            f"--prefix-cache-mb must be a number of MB or a comma-separated list of them, got {text!r}"
        )
    budgets = tuple(check_budget(p, "--prefix-cache-mb") for p in parts)
    if len(set(budgets)) != len(budgets):
        raise InputError(f"--prefix-cache-mb lists a budget twice: {text!r}")
    return budgets


def row_name(method: str, budget, several: bool) -> str:
    """A row's name: the method's, with its budget when the run compares several."""
    if not several:
        return method
    shown = "off" if budget == 0 else "default" if budget is None else f"{budget:g} MB"
    return f"{method} [prefix cache {shown}]"


def expand_rows(methods: list[str], budgets: tuple) -> dict[str, tuple[str, object]]:
    """Row name -> (method, budget), every method with every budget in turn (store off and on alternate)."""
    several = len(budgets) > 1
    return {row_name(m, b, several): (m, b) for m in methods for b in budgets}


def prefill_figures(done) -> dict:
    """Prompt positions prefilled per request (mean) and the share of prompt positions taken from the
    store."""
    prompt = sum(r.prompt_length for r in done)
    reused = sum(getattr(r, "reused_positions", 0) for r in done)
    return {
        "prefill_positions_mean": (prompt - reused) / len(done) if done else None,
        "prefill_saved_share": reused / prompt if prompt else None,
    }
