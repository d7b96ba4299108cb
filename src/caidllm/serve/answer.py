"""What a client may see of one request's answer, step by step.

A stream sends only committed text, left to right: the growth of the longest
gap-free committed prefix of the answer (a step that commits position 40
while position 12 is still masked adds nothing). The text is decoded from
the prefix's tokens each step; a trailing incomplete character (byte-level
tokens) and a trailing piece that could be the start of a stop string are
held back until the next tokens settle them. So the deltas a client
concatenates are exactly the final text, which is what a non-streamed
response returns.

The answer ends at the first end token, at `max_tokens` tokens ("length"),
at a stop string (cut before it, "stop"), or when every block is decoded
without an end token ("length"). As soon as it ends the server takes the
request out of the engine, so its remaining blocks cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from caidllm.decode.request import CommitEvent
from caidllm.serve.stops import StopStrings


@dataclass
class Answer:
    lm: object
    gen_length: int
    max_tokens: int | None
    stop: list[str]
    run_to_end: bool = False  # early_stop off: the engine decodes every block; wait for it before finishing
    tokens: dict[int, int] = field(default_factory=dict)  # position -> committed token
    sent: str = ""  # text already handed out
    finish_reason: str | None = None
    completion_tokens: int = 0
    nfe: int = 0
    steps_per_block: list[int] = field(default_factory=list)
    result: object | None = None  # the engine's GenerationResult, when the request ran to its end
    logprobs: dict[int, tuple] = field(default_factory=dict)  # position -> logprob entry, when asked for
    logprobs_sent: int = 0  # answer tokens whose entries a stream has sent
    _decoded_prefix: int = -1
    _stops: StopStrings | None = None

    def __post_init__(self):
        self._stops = StopStrings(self.stop)

    def update(self, event: CommitEvent) -> str:
        """Take one step's event; the new text to send (possibly empty)."""
        self.nfe += event.forwards
        while len(self.steps_per_block) <= event.block:
            self.steps_per_block.append(0)
        self.steps_per_block[event.block] += 1
        self.tokens.update(zip(event.positions, event.token_ids))
        if event.logprobs:
            self.logprobs.update(zip(event.positions, event.logprobs))
        if event.finished:
            self.result = event.result
        prefix = event.prefix_length
        if prefix == self._decoded_prefix and not event.finished:
            return ""  # no new committed prefix: nothing can have changed (decoding is the costly part)
        self._decoded_prefix = prefix
        limit = prefix if self.max_tokens is None else min(prefix, self.max_tokens)
        ids = [self.tokens[p] for p in range(limit)]
        text = self.lm.decode(ids)
        eos = set(self.lm.config.eos_ids)
        ended = prefix < self.gen_length and self.tokens.get(prefix) in eos
        cut = self._stops.first(text)
        if cut is not None:
            return self._finish(text[:cut], "stop", ids)
        if ended and (event.finished or not self.run_to_end):
            return self._finish(text, "stop", ids)
        if ended:
            return self._emit(text.rstrip("\ufffd"))
        if self.max_tokens is not None and prefix >= self.max_tokens:
            return self._finish(text, "length", ids)
        if event.finished:  # every block decoded and no end token
            return self._finish(text, "length", ids)
        return self._emit(self._settled(text))

    def _settled(self, text: str) -> str:
        """The part of the text that no later token can change."""
        text = text.rstrip("\ufffd")
        return text[: len(text) - self._stops.held(text)]

    def _emit(self, visible: str) -> str:
        if len(visible) <= len(self.sent) or not visible.startswith(self.sent):
            return ""
        delta, self.sent = visible[len(self.sent) :], visible
        return delta

    def _finish(self, text: str, reason: str, ids: list[int]) -> str:
        self.finish_reason = reason
        self.completion_tokens = _tokens_covering(self.lm, ids, len(text))
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text
        return delta

    def new_logprobs(self) -> tuple[list, list[int], int]:
        """The logprob entries and tokens of the answer tokens the text sent so far covers, not yet handed out
        (a stream's share of this step; the whole answer's once it finished), and where their text starts."""
        ids = []
        while len(ids) in self.tokens and (self.max_tokens is None or len(ids) < self.max_tokens):
            ids.append(self.tokens[len(ids)])
        covered = (
            self.completion_tokens if self.finish_reason else _tokens_covering(self.lm, ids, len(self.sent))
        )
        start, self.logprobs_sent = self.logprobs_sent, max(self.logprobs_sent, covered)
        positions = range(start, self.logprobs_sent)
        return (
            [self.logprobs[p] for p in positions],
            [self.tokens[p] for p in positions],
            len(self.lm.decode(ids[:start])),
        )

    @property
    def text(self) -> str:
        return self.sent

    def stats(self) -> dict:
        """caidllm's decoding statistics for the response (the `caidllm` extension field)."""
        r = self.result
        return {
            "nfe": self.nfe,
            "steps_per_block": r.steps_per_block if r is not None else self.steps_per_block,
            "early_stopped": bool(r is not None and r.early_stopped),
            "left_engine_early": r is None,  # ended by stop / max_tokens / end token before every block ran
        }


def _tokens_covering(lm, ids: list[int], length: int) -> int:
    """How many of the answer's tokens the returned text uses (all of them unless a stop string cut it):
    the fewest whose text is as long, by bisection (a text grows with its tokens), so a cut costs
    log2(tokens) decodes, not one per token."""
    if len(lm.decode(ids)) <= length:
        return len(ids)
    low, high = 0, len(ids)  # decode(ids[:high]) reaches `length`; decode(ids[:low]) may not
    while low < high:
        middle = (low + high) // 2
        if len(lm.decode(ids[:middle])) >= length:
            high = middle
        else:
            low = middle + 1
    return high
