"""Stop strings: where the first one starts in an answer's text, and how much of the text's end could
still grow into one (a stream holds that part back until later tokens settle it).

Both in time linear in the text and the stop strings at each step: `str.find` for a whole stop string,
and for the held-back part the longest suffix of the text that is a proper prefix of a stop string, read
by a Knuth-Morris-Pratt automaton over the text's last len(stop) - 1 characters (the failure table
built once per request). The rule it replaces tried every prefix of every stop string at every step:
quadratic in a stop string's length, and a 300 KB one held the server for 13 s.

The request limits (protocol.py checks them) are OpenAI's count, at most 4 sequences, and a length
no answer needs: MAX_STOP_CHARS.
"""

from __future__ import annotations

MAX_STOP_SEQUENCES = 4  # as the OpenAI API
MAX_STOP_CHARS = 512  # a stop string's characters at most (OpenAI sets no figure; this one bounds the work)


def _failure(pattern: str) -> list[int]:
    """KMP's failure table: fail[i] = the length of the longest proper prefix of pattern[:i + 1] that
    is also its suffix."""
    fail, k = [0] * len(pattern), 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        fail[i] = k
    return fail


class StopStrings:
    """One request's stop strings, with their failure tables."""

    def __init__(self, stops: list[str]):
        self.stops = list(stops)
        self._tables = [_failure(s) for s in self.stops]
        # a text ending in none of these characters holds nothing back
        self._chars = [frozenset(s[:-1]) for s in self.stops]

    def first(self, text: str) -> int | None:
        """Where the earliest stop string in the text starts, or None."""
        return min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=None)

    def held(self, text: str) -> int:
        """How many of the text's last characters could be the start of a stop string."""
        if not text:
            return 0
        rules = zip(self.stops, self._tables, self._chars)
        return max((self._overlap(text, s, fail) for s, fail, chars in rules if text[-1] in chars), default=0)

    @staticmethod
    def _overlap(text: str, stop: str, fail: list[int]) -> int:
        """The longest proper prefix of `stop` that the text ends with (a whole one was cut already)."""
        k = 0
        for c in text[-(len(stop) - 1) :]:
            while k and c != stop[k]:
                k = fail[k - 1]
            if c == stop[k]:
                k += 1
            if k == len(stop):
                k = fail[k - 1]
        return k
