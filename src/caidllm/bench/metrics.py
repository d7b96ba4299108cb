"""Small metrics: standard error, token F1 and ROUGE-L (LongBench)."""

from __future__ import annotations

import math
import re
import string
from collections import Counter

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def stderr(values) -> float | None:
    """Standard error of the mean with the sample standard deviation, as
    lm-eval's mean_stderr: for 0/1 scores it is sqrt(p(1-p)/(n-1))."""
    values = list(values)
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    variance = sum((v - m) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance / n)


def normalise_answer(text: str) -> str:
    """SQuAD-style: lower case, punctuation and articles removed, spaces collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _words(text: str) -> list[str]:
    return "".join(ch for ch in text.lower() if ch not in _PUNCTUATION).split()


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalise_answer(prediction).split(), normalise_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _lcs_length(a: list[str], b: list[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, 1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 (LCS-based, beta = 1) over lower-cased, punctuation-free words."""
    pred, ref = _words(prediction), _words(reference)
    if not pred or not ref:
        return float(pred == ref)
    lcs = _lcs_length(pred, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(pred), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def best_over(metric, prediction: str, references) -> float:
    return max((metric(prediction, r) for r in references), default=0.0)
