"""Elastic-Cache's window and tracked tokens (cache mode "elastic"): Nguyen-Tri, Ranjan and Shen,
"Attention Is All You Need for KV Cache in Diffusion LLMs" (arXiv 2510.14973). Official code:
VILA-Lab/Elastic-Cache, read in its public copy yxu-dev/Elastic-Cache at commit 46c0bc3
(llada/generate.py `generate_with_elastic_cache`, llada/model/modeling_llada.py `LLaDABlock.attention`).

As the official loop runs it (elastic_scope="generation", the `elastic` preset):
- the first forward computes every column; after it, a forward computes the tracked tokens, the
  positions decoded at the previous step and the sliding window (the first `elastic_window` still-masked
  positions of the whole generation); every other column's K/V (and queries) come from the cache;
- only the window is decoded, at every step (Fast-dLLM's threshold rule over the window);
- at each layer the window's attention, summed over heads and queries, names the `elastic_track`
  most-attended keys that are not still masked: their union over layers is the next step's tracked set;
- at each layer below the refresh, each tracked token's attention over every key is computed twice,
  with its cached query against the keys cached before this step and with its fresh query against the
  updated keys; their cosine similarity over heads, averaged over tokens and keys, below `elastic_gamma`
  makes every deeper layer (from the next one, in the same forward) compute the whole canvas
  (models/elastic.py);
- the first end token decoded cuts the generation there: later positions are never decoded (they stay
  masks in the canvas; the result shows them as the end token), and the loop ends when no mask is left
  before the cut.
The loop has no blocks: the request is one block of gen_length, and a block_length given that differs is
refused (decode/config.py), never silently replaced.

elastic_scope="block" (the `elastic-block` preset, caidllm's earlier reading): the same rule with the
window taken inside the current block and every block starting with a forward of every column (a
refresh of the whole depth); no cut at the end token (the engine's early stop applies).
Dream: the positions whose hidden state predicts the window (i - 1) are computed too (caidllm's reading;
the official Dream file was not re-stated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from caidllm.decode.caches.base import CacheMode
from caidllm.errors import InputError
from caidllm.setting_rules import (
    UNIT_INTERVAL,
    CacheSettings,
    Rule,
    choice_rule,
    named,
    non_negative_int,
    positive_int,
    unit_interval,
)

DEFAULT_WINDOW = 16
SCOPES = ("generation", "block")


@dataclass
class ElasticSettings(CacheSettings):
    """The drift test's cosine threshold, the sliding window (None: 16, cut to the block), the shallowest
    layer the drift test runs at (0: every layer, as the official), the most-attended keys tracked per
    layer (the official track_num), and where the window slides: "generation" (the official: over the
    whole generation, one block of gen_length) or "block" (inside each block, each starting with a whole
    forward)."""

    gamma: float = 0.9
    window: int | None = None
    layer: int = 0
    track: int = 1
    scope: str = "generation"

    OWNER: ClassVar[str] = "elastic"
    TITLE: ClassVar[str] = "Elastic-Cache (arXiv 2510.14973)"
    LEGACY: ClassVar[dict[str, str]] = {
        f"elastic_{name}": name for name in ("gamma", "window", "layer", "track", "scope")
    }
    RULES: ClassVar[tuple[Rule, ...]] = (
        choice_rule("scope", SCOPES),
        Rule("gamma", UNIT_INTERVAL, unit_interval),
        Rule("window", "a positive integer or None", lambda v: v is None or positive_int(v)),
        Rule("layer", "an integer >= 0", non_negative_int),
        Rule("track", "a positive integer", positive_int),
    )

    @property
    def whole_generation(self) -> bool:
        return self.scope == "generation"

    def settle_lengths(self, config) -> None:
        """The official loop is one block of gen_length. A block length the caller gave that differs is
        refused, never silently replaced (a default, or a length a run shares with block-wise methods, is
        not given: presets.lays_blocks)."""
        if not self.whole_generation or not positive_int(config.gen_length):
            return
        bl = config.block_length
        if "block_length" in config.given and not positive_int(bl):
            return  # the block length's own rule names it
        if "block_length" in config.given and bl != config.gen_length:
            raise InputError(
                f"block_length {bl} does not apply to method {config.method!r}: Elastic-Cache's official "
                "loop "
                f"(cache 'elastic', elastic_scope 'generation') decodes the whole generation (gen_length "
                f"{config.gen_length}) as one block with its own sliding window; drop block_length, or use "
                f"method 'elastic-block' (elastic_scope='block') for blocks of {bl}",
                field="block_length",
            )
        config.block_length = config.gen_length

    def check_with(self, config) -> None:
        if (self.window or 0) > config.block_length:
            name, field = named(config.labels, "elastic.window")
            longer = (
                f"the generation (gen_length {config.gen_length})"
                if self.whole_generation
                else f"the block ({config.block_length})"
            )
            raise InputError(f"{name} ({self.window}) is longer than {longer}", field=field)
        if config.refresh_every:
            raise InputError(
                f"cache 'elastic' with refresh_every={config.refresh_every} is not meaningful: "
                "Elastic-Cache refreshes when its drift test says so (use refresh_every=0)",
                field="refresh_every",
            )
        if getattr(config.policy_settings, "grinding_action", None) == "exit":
            raise InputError(
                "cache 'elastic' with cai.grinding_action='exit' is not meaningful: the exit commits "
                "the whole block at once, but an elastic step predicts only its window",
                field=config.labels.get("cai.grinding_action", "method"),
            )


@dataclass
class ElasticState:
    """One request's Elastic-Cache bookkeeping (columns are relative to its first real column)."""

    shift: int  # the family's logit shift (Dream 1: position i is predicted from i - 1)
    n_layers: int
    block: int = -1
    tracked: list[int] = field(default_factory=list)  # the previous forward's most-attended columns
    cut: int | None = (
        None  # generation scope: the first end token decoded (later positions are never decoded)
    )
    last_refresh_from: int = 0  # the layer the last forward's refresh started at (n_layers: none)

    def enter_block(self, block: int) -> None:
        if block != self.block:  # a block's first forward computes every column: nothing tracked yet
            self.block, self.tracked = block, []

    def observe(self, tracked: list[int], refresh_from: int) -> None:
        self.tracked, self.last_refresh_from = tracked, refresh_from


def window(generated: list[int | None], bounds: tuple[int, int], size: int, last_step: bool) -> list[int]:
    """The generated positions a step decodes: the first `size` still-masked ones within `bounds`
    (all of them at the last allowed step, so no mask is left)."""
    masked = [p for p in range(*bounds) if generated[p] is None]
    return masked if last_step else masked[:size]


def columns(
    state: ElasticState, prompt_length: int, predicted: list[int], just_decoded: list[int]
) -> list[int]:
    """The columns a forward after the first computes (relative): the tracked tokens, the positions
    decoded at the previous step (their K/V were still their mask's), the window and what predicts it."""
    window_columns = [prompt_length + p for p in predicted]
    sources = [c - state.shift for c in window_columns]
    decoded = [prompt_length + p for p in just_decoded]
    return sorted(set(window_columns) | set(sources) | set(state.tracked) | set(decoded))


def untrackable(generated: list[int | None], prompt_length: int) -> list[int]:
    """The columns the tracked set leaves out (relative): the generated positions still masked."""
    return [prompt_length + p for p, token in enumerate(generated) if token is None]


def cut_at_end_token(
    generated: list[int | None], committed: list[int], eos_ids: set[int], eos_id: int
) -> int | None:
    """The official early stop: the first end token among this step's commits cuts the generation;
    the positions after it that are still masked are given up (shown as `eos_id`). Returns the cut."""
    ends = [p for p in committed if generated[p] in eos_ids]
    if not ends:
        return None
    cut = min(ends)
    for p in range(cut + 1, len(generated)):
        if generated[p] is None:
            generated[p] = eos_id
    return cut


@dataclass(frozen=True)
class ElasticCache(CacheMode):
    """Cache mode "elastic": every forward is its own (its first computes every column); it refreshes
    from the layer its drift test names, never on a fixed period; the cache row keeps every layer's input."""

    def refusal(self, config, lm) -> str | None:
        c = lm.config
        if getattr(lm, "tp", None) is not None:
            return (
                f"cache mode 'elastic' reads each layer's attention over every head, which --tp {lm.tp.size} "
                "divides among the ranks; run it without --tp"
            )
        if c.block_causal:
            return (
                "cache mode 'elastic' needs the elastic forward (bidirectional attention over every "
                "column), "
                f"which model family {c.family!r} does not have (block-causal attention)"
            )
        return None

    def check_settings(self, config, lm) -> None:
        c = lm.config
        if config.cache_settings.layer >= c.n_layers:
            name, field = named(config.labels, "elastic.layer")
            raise InputError(
                f"{name} ({config.cache_settings.layer}) is beyond the model's layers (family "
                f"{c.family!r} has {c.n_layers}: 0 .. {c.n_layers - 1})",
                field=field,
            )

    def new_state(self, request, lm) -> ElasticState:
        return ElasticState(lm.model.extra_left, lm.config.n_layers)

    def refresh_every(self, configured: int) -> int:
        return 0

    def frame_options(self, config) -> dict:
        return dict(every_layer=True)

    def commit_only(self, request) -> set[int]:
        """The window, at every step (the official loop decodes nothing else)."""
        return {c - len(request.prompt) - request.block_bounds[0] for c in self.columns(request)[2]}

    def untrackable(self, request) -> list[int]:
        """The columns the tracked set leaves out (relative): the still-masked ones."""
        return untrackable(request.generated, len(request.prompt))

    def columns(self, request) -> tuple[list[int], list[int], list[int]]:
        """The computed columns, the columns whose logits it returns and its window (the positions it
        decodes), relative to the row's first real column. A block's first forward computes every column
        and returns the whole block's logits (CAI reads them)."""
        state, config = request.cache_state, request.config
        state.enter_block(request.block)
        size = config.cache_settings.window or DEFAULT_WINDOW  # None: 16, cut to the block when shorter
        p, bounds = len(request.prompt), request.block_bounds
        predicted = window(request.generated, bounds, size, request.step == request.step_limit - 1)
        decoded = [p + q for q in predicted]
        if request.step == 0:
            return list(range(p + len(request.generated))), [p + b for b in range(*bounds)], decoded
        return columns(state, p, predicted, request.last_committed), decoded, decoded

    def after_record(self, request, positions: list[int], eos_ids: set[int], eos_id: int) -> None:
        state, config = request.cache_state, request.config
        if config.whole_generation and config.early_stop and state.cut is None:
            # Elastic-Cache's own stop: nothing after its first end token
            state.cut = cut_at_end_token(request.generated, positions, eos_ids, eos_id)
