"""A constraint's token-level automaton, compiled by outlines-core (docs/structured-output.md says why that
library): its transitions as flat arrays (source state, token, target state), which the any-order state sets
(canvas.py) walk with whole-array operations. Two states are caidllm's own: `done`, reached from an accepting
state by an end token and kept by end tokens (an answer shorter than the canvas ends there, the rest EOS), so
the canvas length and the end tokens are part of the automaton."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from caidllm.errors import InputError

_CACHE: OrderedDict = OrderedDict()  # (tokenizer, regex, end ids) -> TokenAutomaton, most recent last
_CACHE_SIZE = 64


@dataclass
class TokenAutomaton:
    """States 0 .. n_states - 1; `initial`; `accepting` [n_states] bool (the regex's final states and done).
    Edges sorted by token: edge_src / edge_token / edge_dst, with token_offsets [vocab + 1] (token t's edges
    are token_offsets[t]:token_offsets[t + 1]); pair_src / pair_dst: the distinct (source, target) pairs,
    which a hole (any token) follows."""

    n_states: int
    initial: int
    accepting: np.ndarray
    edge_src: np.ndarray
    edge_token: np.ndarray
    edge_dst: np.ndarray
    token_offsets: np.ndarray
    pair_src: np.ndarray
    pair_dst: np.ndarray
    vocab_size: int
    end_token: int  # the end token that pads an answer shorter than its canvas

    def next_state(self, state: int, token: int) -> int | None:
        lo, hi = self.token_offsets[token], self.token_offsets[token + 1]
        hit = np.nonzero(self.edge_src[lo:hi] == state)[0]
        return int(self.edge_dst[lo + hit[0]]) if len(hit) else None

    def allowed_after(self, state: int) -> np.ndarray:
        """[vocab] bool: the tokens with an edge out of `state` (a left-to-right walk's mask)."""
        allowed = np.zeros(self.vocab_size, dtype=bool)
        allowed[self.edge_token[self.edge_src == state]] = True
        return allowed

    def shortest_accepted(self) -> int | None:
        """Tokens in the shortest accepted answer (end token excluded), None if none is."""
        reached = np.zeros(self.n_states, dtype=bool)
        reached[self.initial] = True
        frontier, length = reached.copy(), 0
        while frontier.any():
            if (frontier & self.accepting).any():
                return length
            nxt = np.zeros(self.n_states, dtype=bool)
            nxt[self.pair_dst[frontier[self.pair_src]]] = True
            frontier = nxt & ~reached
            reached |= nxt
            length += 1
        return None


def token_bytes(tokenizer) -> dict[int, bytes]:
    """Each ordinary token's bytes (special and added tokens left out: a constraint never allows them).
    Byte-level vocabularies (GPT-2 style) are mapped back to bytes; SentencePiece ones read '▁' as a space
    and <0xNN> as that byte."""
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    byte_level = _byte_level_map()
    vocab = tokenizer.get_vocab()
    is_byte_level = all(
        all(ch in byte_level for ch in token) for token, i in vocab.items() if i not in special
    )
    out = {}
    for token, i in vocab.items():
        if i in special:
            continue
        if is_byte_level:
            out[i] = bytes(byte_level[ch] for ch in token)
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            out[i] = bytes([int(token[3:5], 16)])
        else:
            out[i] = token.replace("\u2581", " ").encode()
    return out


def _byte_level_map() -> dict[str, int]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the others for code points from
    256."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    rest = [b for b in range(256) if b not in set(printable)]
    mapping = {chr(b): b for b in printable}
    mapping.update({chr(256 + n): b for n, b in enumerate(rest)})
    return mapping


def compile_regex(
    tokenizer,
    regex: str,
    end_ids: tuple[int, ...],
    mask_id: int,
    field: str = "regex",
    vocab_size: int | None = None,
) -> TokenAutomaton:
    """The token automaton of `regex` over `tokenizer`'s vocabulary (cached); InputError naming `field` when
    the library cannot compile it or it accepts nothing."""
    key = (id(tokenizer), regex, tuple(end_ids), vocab_size)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key][1]
    automaton = _build(tokenizer, regex, tuple(end_ids), mask_id, field, vocab_size)
    _CACHE[key] = (tokenizer, automaton)  # the tokenizer is held so that its id is not reused meanwhile
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return automaton


def _build(
    tokenizer, regex: str, end_ids: tuple[int, ...], mask_id: int, field: str, vocab_size: int | None
) -> TokenAutomaton:
    from outlines_core import Index, Vocabulary

    pieces: dict[bytes, list[int]] = {}
    for i, piece in token_bytes(tokenizer).items():
        if i != mask_id and i not in end_ids and piece:
            pieces.setdefault(piece, []).append(i)
    vocabulary = Vocabulary(end_ids[0], pieces)
    try:
        index = Index(regex, vocabulary)
    except (ValueError, RuntimeError) as error:
        raise InputError(
            f"{field}: cannot be compiled into a token automaton for this model's vocabulary: "
            f"{str(error)[:300]}"
        ) from None
    return _arrays(index, end_ids, vocab_size or len(tokenizer), field)


def _arrays(index, end_ids: tuple[int, ...], vocab_size: int, field: str) -> TokenAutomaton:
    transitions = index.get_transitions()
    names = sorted(
        set(transitions)
        | {index.get_initial_state()}
        | set(index.get_final_states())
        | {t for edges in transitions.values() for t in edges.values()}
    )
    number = {name: n for n, name in enumerate(names)}
    done = len(names)
    ends = set(end_ids)
    triples = [
        (number[s], token, number[t])
        for s, edges in transitions.items()
        for token, t in edges.items()
        if token not in ends
    ]
    finals = [number[s] for s in index.get_final_states()]
    triples += [(state, end, done) for state in finals + [done] for end in end_ids]
    if not triples:
        raise InputError(f"{field}: matches nothing that this model's tokens can spell")
    edges = np.array(sorted(triples, key=lambda e: (e[1], e[0])), dtype=np.int64)
    accepting = np.zeros(done + 1, dtype=bool)
    accepting[finals + [done]] = True
    offsets = np.searchsorted(edges[:, 1], np.arange(vocab_size + 1)).astype(np.int64)
    pairs = np.unique(edges[:, [0, 2]], axis=0)
    automaton = TokenAutomaton(
        done + 1,
        number[index.get_initial_state()],
        accepting,
        edges[:, 0].copy(),
        edges[:, 1].copy(),
        edges[:, 2].copy(),
        offsets,
        pairs[:, 0].copy(),
        pairs[:, 1].copy(),
        vocab_size,
        end_ids[0],
    )
    if automaton.shortest_accepted() is None:
        raise InputError(f"{field}: matches nothing that this model's tokens can spell")
    return automaton
