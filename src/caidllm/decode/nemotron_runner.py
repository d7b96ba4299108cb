"""The forwards the sequential decoders (decode/nemotron.py: ar, nemotron-dlm, linear-spec) call, one
request at a time: a causal *prefill* of the prompt, a bidirectional *draft* of a block over the decided
tokens (nothing kept), a causal *verify* of a block (its keys and values kept), and *crop* back to an
accepted prefix. Each returns float32 logits [n, V] of the tokens it was given.

`CacheRunner` is the official one: a model of the sequential family (Nemotron-Labs-Diffusion) over its
KV cache, exactly the ``use_cache`` / ``diffusion_lm`` switches of the modeling file. `RecomputeRunner`
runs the same calls on a model of any other position-aligned family (forced linear-spec or ar: those
models were not trained as causal language models), recomputing the whole sequence under an explicit
attention pattern at every call: no cache, the same logits a cache would give.
"""

from __future__ import annotations

import torch


class CacheRunner:
    def __init__(self, lm):
        self.model, self.device = lm.model, lm.device
        self.cache = self.model.new_cache()
        self.forwards = 0

    @property
    def length(self) -> int:
        return self.cache.length

    def _run(self, tokens: list[int], causal: bool, write: bool) -> torch.Tensor:
        self.forwards += 1
        ids = torch.tensor([tokens], device=self.device)
        return self.model.run(ids, self.cache, causal=causal, write=write)[0]

    def prefill(self, tokens: list[int]) -> torch.Tensor:
        return self._run(tokens, causal=True, write=True)

    def verify(self, tokens: list[int]) -> torch.Tensor:
        return self._run(tokens, causal=True, write=True)

    def draft(self, tokens: list[int]) -> torch.Tensor:
        return self._run(tokens, causal=False, write=False)

    def crop(self, length: int) -> None:
        self.cache.crop(length)


class RecomputeRunner:
    """The decided tokens kept as ids; every call one forward over all of them plus the new ones
    (DiffusionLM.forward_with_attention): causal among the decided and verified tokens, a draft block
    seeing every decided token and the whole block."""

    def __init__(self, lm):
        self.lm, self.device = lm, lm.device
        self.ids: list[int] = []
        self.forwards = 0

    @property
    def length(self) -> int:
        return len(self.ids)

    def _run(self, tokens: list[int], causal: bool) -> torch.Tensor:
        self.forwards += 1
        past, n = len(self.ids), len(tokens)
        total = past + n
        attention = torch.ones(total, total, dtype=torch.bool, device=self.device).tril()
        if not causal:
            attention[past:, past:] = True
        ids = torch.tensor([self.ids + tokens], device=self.device)
        positions = torch.arange(total, device=self.device)[None]
        targets = torch.arange(past, total, device=self.device)[None]
        return self.lm.forward_with_attention(ids, positions, attention[None, None], targets)[0]

    def prefill(self, tokens: list[int]) -> torch.Tensor:
        return self.verify(tokens)

    def verify(self, tokens: list[int]) -> torch.Tensor:
        logits = self._run(tokens, causal=True)
        self.ids += list(tokens)
        return logits

    def draft(self, tokens: list[int]) -> torch.Tensor:
        return self._run(tokens, causal=False)

    def crop(self, length: int) -> None:
        del self.ids[length:]
