"""A constraint held over a whole canvas whose positions commit in any order (docs/structured-output.md).

forward[i]: the automaton states some filling of the holes before position i reaches (a committed token is
followed as it is, a hole by every token); backward[i]: the states from which positions i .. end can still be
filled so that the canvas ends accepted. A token may go at hole i only if it leads some state of forward[i]
into backward[i + 1]; every committed token keeping that, the canvas stays completable whatever the order.
Both are [length + 1, states] bool arrays, recomputed after commits only from the changed positions on (and
only until a set comes out as it was)."""

from __future__ import annotations

import numpy as np

from caidllm.decode.constraints.automaton import TokenAutomaton
from caidllm.errors import InputError


class CanvasConstraint:
    """One request's constraint state: its automaton and the tokens committed so far (None: a hole)."""

    def __init__(
        self,
        automaton: TokenAutomaton,
        length: int,
        field: str = "constraint",
        answer_limit: int | None = None,
    ):
        self.automaton, self.length = automaton, length
        self.tokens: list[int | None] = [None] * length
        # An answer cut at answer_limit tokens (a server's max_tokens under a larger canvas) must end
        # by then: the positions after it are end tokens from the start.
        limit = length if answer_limit is None else min(answer_limit, length)
        self.fixed = {p: automaton.end_token for p in range(limit, length)}
        self.tokens[limit:] = [automaton.end_token] * (length - limit)
        n = automaton.n_states
        self.forward = np.zeros((length + 1, n), dtype=bool)
        self.backward = np.zeros((length + 1, n), dtype=bool)
        self.forward[0, automaton.initial] = True
        self.backward[length] = automaton.accepting
        self._dirty: tuple[int, int] | None = (0, self.length)
        self._refresh()
        if not self.backward[0, automaton.initial]:
            shortest = automaton.shortest_accepted()
            raise InputError(
                f"{field}: its shortest answer takes {shortest} tokens, more than the "
                f"{limit} the answer may have (raise gen_length / max_tokens)"
            )

    def allowed(self, position: int) -> np.ndarray:
        """[vocab] bool: the tokens that may be committed at `position` now (the canvas stays completable)."""
        if position in self.fixed:
            out = np.zeros(self.automaton.vocab_size, dtype=bool)
            out[self.fixed[position]] = True
            return out
        self._refresh()
        a = self.automaton
        live = self.forward[position][a.edge_src] & self.backward[position + 1][a.edge_dst]
        out = np.zeros(a.vocab_size, dtype=bool)
        out[a.edge_token[live]] = True
        return out

    def commit(self, position: int, token: int) -> None:
        if position in self.fixed:
            return
        self.tokens[position] = token
        lo, hi = (position, position) if self._dirty is None else self._dirty
        self._dirty = (min(lo, position), max(hi, position))

    def _refresh(self) -> None:
        if self._dirty is None:
            return
        lo, hi = self._dirty
        self._dirty = None
        for i in range(lo, self.length):  # forward[i + 1] depends on forward[i] and token i
            new = self._step_forward(self.forward[i], self.tokens[i])
            if i >= hi and np.array_equal(new, self.forward[i + 1]):
                break
            self.forward[i + 1] = new
        for i in range(hi, -1, -1):  # backward[i] depends on backward[i + 1] and token i
            if i == self.length:
                continue
            new = self._step_backward(self.backward[i + 1], self.tokens[i])
            if i <= lo and np.array_equal(new, self.backward[i]):
                break
            self.backward[i] = new

    def _step_forward(self, states: np.ndarray, token: int | None) -> np.ndarray:
        a = self.automaton
        src, dst = (a.pair_src, a.pair_dst) if token is None else self._token_edges(token)
        out = np.zeros(a.n_states, dtype=bool)
        out[dst[states[src]]] = True
        return out

    def _step_backward(self, states: np.ndarray, token: int | None) -> np.ndarray:
        a = self.automaton
        src, dst = (a.pair_src, a.pair_dst) if token is None else self._token_edges(token)
        out = np.zeros(a.n_states, dtype=bool)
        out[src[states[dst]]] = True
        return out

    def _token_edges(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        a = self.automaton
        if not 0 <= token < a.vocab_size:
            return a.edge_src[:0], a.edge_dst[:0]
        lo, hi = a.token_offsets[token], a.token_offsets[token + 1]
        return a.edge_src[lo:hi], a.edge_dst[lo:hi]
