"""Elastic-Cache's refresh rule (cache mode "elastic"): Nguyen-Tri, Ranjan and Shen, "Attention Is All
You Need for KV Cache in Diffusion LLMs" (arXiv 2510.14973; official code VILA-Lab/Elastic-Cache, not
in our search index: the rule below is the paper's, in the reading stated here).

Per request and block: the block's first step is a full forward (a refresh of every layer). After it,
each step computes only the sliding window (the first ``elastic_window`` still-masked positions of the
block; the whole rest of the block at the block's last allowed step, so no mask is left), the
positions whose hidden state predicts them (Dream: i - 1), the previous step's most-attended tokens and
the positions the previous step decoded (once, so that their K/V are their token's, not their mask's);
every other column's K/V come from the cache, and only the window's positions may be committed.

When: at every layer the forward measures the window queries' attention, averaged over the queries,
per head, over the row's keys (its profile). The most-attended tokens are each layer's argmax of the
head-averaged profile. The drift test compares, at each layer from ``elastic_layer`` (the depth
boundary) on, this step's profile with the previous step's on the previous step's most-attended
tokens (heads x tokens, cosine similarity): the first layer where it falls below ``elastic_gamma``
is where the refresh starts. Where: that layer and every deeper one are recomputed over the whole
canvas (models/elastic.py); shallower layers keep their cache.

Readings taken (the official loop was not available to check them): the refresh runs at the next
step (the engine runs one forward per step), not again within the step that detected the drift; the
similarity is over heads x most-attended tokens (a lone token's scalar cosine is always 1); the
just-decoded positions are recomputed once (as dKV-Cache's delayed caching does); the window is taken
inside the current block; no drift test at the first step after a refresh of the
whole depth (nothing to compare with); gamma 0.9 and a window of 16 are the defaults (a window of
16 is cut to the block when the block is shorter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

DEFAULT_WINDOW = 16


@dataclass
class ElasticState:
    """One request's Elastic-Cache bookkeeping (columns are relative to its first real column)."""

    shift: int  # the family's logit shift (Dream 1: position i is predicted from i - 1)
    n_layers: int
    block: int = -1
    profiles: list[torch.Tensor] | None = None  # the previous step's, per layer [heads, keys]
    most_attended: list[int] = field(default_factory=list)
    refresh_from: int = 0  # the next elastic forward's first layer over every column

    def enter_block(self, block: int) -> None:
        if block != self.block:  # the block's first step was a full refresh: nothing to compare with yet
            self.block, self.profiles, self.most_attended, self.refresh_from = block, None, [], self.n_layers

    def observe(self, profiles: list[torch.Tensor], gamma: float, boundary: int) -> None:
        """After an elastic forward: where the next one refreshes from, and its most-attended tokens."""
        if self.profiles is None:
            self.refresh_from = self.n_layers
        else:
            self.refresh_from = drift_layer(self.profiles, profiles, self.most_attended, gamma, boundary)
        self.profiles, self.most_attended = profiles, most_attended(profiles)


def most_attended(profiles: list[torch.Tensor]) -> list[int]:
    """The keys each layer attends most to (head-averaged), without repeats, ascending."""
    return sorted({int(p.mean(dim=0).argmax()) for p in profiles})


def drift_layer(previous: list[torch.Tensor], current: list[torch.Tensor], tokens: list[int], gamma: float,
                boundary: int) -> int:
    """The first layer from `boundary` on whose attention to `tokens` moved (cosine < gamma); len(current)
    when none did."""
    at = torch.tensor(tokens, dtype=torch.long)
    for layer in range(boundary, len(current)):
        before, now = previous[layer][:, at].flatten(), current[layer][:, at].flatten()
        if float(torch.nn.functional.cosine_similarity(before, now, dim=0)) < gamma:
            return layer
    return len(current)


def window(generated: list[int | None], block_bounds: tuple[int, int], size: int, last_step: bool) -> list[int]:
    """The generated positions the step predicts: the block's first `size` still-masked ones (all at its last step)."""
    masked = [p for p in range(*block_bounds) if generated[p] is None]
    return masked if last_step else masked[:size]


def columns(state: ElasticState, prompt_length: int, predicted: list[int], just_decoded: list[int]) -> list[int]:
    """The columns an elastic forward computes (relative): the window, what predicts it, the most-attended,
    and the positions decoded at the previous step (their K/V were still their mask's)."""
    window_columns = [prompt_length + p for p in predicted]
    sources = [c - state.shift for c in window_columns]
    decoded = [prompt_length + p for p in just_decoded]
    return sorted(set(window_columns) | set(sources) | set(state.most_attended) | set(decoded))
