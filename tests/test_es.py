"""ES-dLLM early skipping: the "es" forward mode, its cache of hidden states,
importance ranking, and the es-dllm / cai-es methods through the engine, API
and CLI. Tiny random 8-layer checkpoints, so the default schedule has three
distinct layer groups (layers 0 | 1 | 2-7)."""

import json
import math

import pytest
import torch

import caidllm
from caidllm.cli import main as cli_main
from caidllm.decode import build_config, generate
from caidllm.errors import InputError
from caidllm.models import EarlySkip
from caidllm.models.layers import Context, positions_from_mask
from caidllm.models.modes import Dual, EarlySkipping
from caidllm.models.skip import (
    DEFAULT_SCHEDULE,
    choose,
    forced_keeps,
    group_start_layers,
    hidden_levels,
    importance,
    keep_counts,
)

LAYERS = 8
KEEP_ALL = ((1.0, 0.0), (1.0, 0.125), (1.0, 0.25))
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23, 24, 25, 26]]


@pytest.fixture(scope="module")
def deep_dirs(random_checkpoint):
    return {family: random_checkpoint(family, n_layers=LAYERS) for family in ("llada", "dream")}


@pytest.fixture(scope="module")
def deep_lms(deep_dirs):
    return {family: caidllm.load(path, device="cpu", dtype="float32") for family, path in deep_dirs.items()}


@pytest.fixture(params=["llada", "dream"])
def lm(request, deep_lms):
    return deep_lms[request.param]


def canvas(lm, prompt_lengths, gen=24, seed=0):
    """Left-padded prompts, then 6 committed tokens and mask tokens; the block is [P+8, P+16)."""
    g = torch.Generator().manual_seed(seed)
    B, P = len(prompt_lengths), max(prompt_lengths)
    ids = torch.full((B, P + gen), lm.config.pad_id)
    mask = torch.zeros(B, P + gen, dtype=torch.bool)
    for b, n in enumerate(prompt_lengths):
        ids[b, P - n : P] = torch.randint(10, 300, (n,), generator=g)
        mask[b, P - n :] = True
    ids[:, P:] = lm.config.mask_id
    ids[:, P : P + 6] = torch.randint(10, 300, (B, 6), generator=g)
    return ids, mask, P + 8, P + 16


def skip_for(ids, start, end, schedule=DEFAULT_SCHEDULE, seed=1, mask_id=None):
    g = torch.Generator().manual_seed(seed)
    R, n = ids.shape[0], end - start
    committed = torch.zeros(R, n, dtype=torch.bool)
    committed[:, 1] = True
    return EarlySkip(
        prev_confidence=torch.rand(R, n, generator=g),
        just_committed=committed,
        masked=ids[:, start:end] == mask_id,
        schedule=schedule,
    )


def advance(ids, start):
    """The canvas one step later: two block tokens committed."""
    ids = ids.clone()
    ids[:, start + 1] = 42
    ids[:, start + 4] = 43
    return ids


def run(lm, prompts, method, **kw):
    kw = {"gen_length": 16, "block_length": 8, "early_stop": False, **kw}
    return generate(lm, prompts, method=method, **kw)


# ---- schedule -------------------------------------------------------------------


def test_schedule_maps_to_layers():
    assert group_start_layers(DEFAULT_SCHEDULE, 32) == [0, 4, 8]
    assert group_start_layers(DEFAULT_SCHEDULE, 28) == [0, 4, 7]  # 3.5 rounds up
    assert group_start_layers(DEFAULT_SCHEDULE, 2) == [0, 1, 1]  # layer 0 always runs every position
    assert keep_counts(DEFAULT_SCHEDULE, 32, 64) == [64] * 4 + [32] * 4 + [16] * 24
    assert keep_counts(DEFAULT_SCHEDULE, 2, 8) == [8, 2]  # collapsed groups: the later one wins
    assert keep_counts(((1.0, 0.0), (0.3, 0.5)), 4, 10) == [10, 10, 3, 3]  # ceil, without float noise
    assert keep_counts(DEFAULT_SCHEDULE, 8, 6) == [6, 3, 2, 2, 2, 2, 2, 2]  # ceil(0.25 * 6) = 2
    assert hidden_levels(DEFAULT_SCHEDULE, 32) == (4, 8, 32)
    assert hidden_levels(DEFAULT_SCHEDULE, 2) == (1, 2)
    assert hidden_levels(KEEP_ALL, 8) == (8,)


# ---- importance -----------------------------------------------------------------


def test_forced_keeps():
    conf = torch.tensor(
        [[0.9, 0.1, 0.8, 0.95, 0.2, 0.3], [0.9, 0.1, 0.8, 0.95, 0.2, 0.3], [0.9, 0.1, 0.8, 0.95, 0.2, 0.3]]
    )
    masked = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    committed = torch.tensor([[1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0]], dtype=torch.bool)
    forced = forced_keeps(conf, masked, committed)
    # Row 0: just committed 0, leftmost masked 1, two most confident masked 2 (0.8) and 5 (0.3).
    assert forced[0].tolist() == [True, True, True, False, False, True]
    # Row 1: one masked position (both leftmost and most confident), no unmasked one added for the second.
    assert forced[1].tolist() == [False, False, False, True, True, False]
    # Row 2: nothing masked: only the just-committed position.
    assert forced[2].tolist() == [False, False, True, False, False, False]


def test_importance_mixes_confidence_and_normalised_drift():
    conf = torch.tensor([[0.2, 0.8, 0.5]])
    drift = torch.tensor([[4.0, 1.0, 2.0]])  # normalised by the row's max: 1, 0.25, 0.5
    none = torch.zeros(1, 3, dtype=torch.bool)
    assert importance(conf, drift, none, 0.5).tolist()[0] == pytest.approx([0.6, 0.525, 0.5])
    assert choose(importance(conf, drift, none, 0.5), 2).tolist() == [[0, 1]]
    assert choose(importance(conf, drift, none, 1.0), 1).tolist() == [[1]]  # confidence only
    assert choose(importance(conf, drift, none, 0.0), 1).tolist() == [[0]]  # drift only
    # Drift is relative to the row: scaling one row's drift changes nothing.
    assert torch.allclose(importance(conf, drift * 1000, none, 0.5), importance(conf, drift, none, 0.5))
    # A forced keep beats any mix, even with the lowest confidence and drift.
    forced = torch.tensor([[False, False, True]])
    assert choose(importance(conf, torch.tensor([[4.0, 1.0, 0.0]]), forced, 0.5), 1).tolist() == [[2]]
    # Ties go to the leftmost; the kept indices come back in ascending order.
    assert choose(torch.tensor([[0.5, 0.9, 0.5, 0.5]]), 3).tolist() == [[0, 1, 2]]


def test_each_row_ranks_its_own_positions():
    conf = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.9, 0.1, 0.2, 0.3]])
    drift = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 8.0]])
    none = torch.zeros(2, 4, dtype=torch.bool)
    both = choose(importance(conf, drift, none, 0.5), 2)
    for r in range(2):
        assert torch.equal(
            both[r], choose(importance(conf[r : r + 1], drift[r : r + 1], none[r : r + 1], 0.5), 2)[0]
        )
    assert both.tolist() == [[1, 3], [0, 3]]


# ---- the es forward --------------------------------------------------------------


@pytest.mark.parametrize("rows", [None, [2, 0]])
def test_keep_all_equals_dual(lm, rows):
    ids, mask, start, end = canvas(lm, [5, 9, 3])
    B, L = ids.shape
    rows_t = None if rows is None else torch.tensor(rows)
    sel = slice(None) if rows is None else rows_t
    dual_cache, es_cache = lm.new_cache(B, L), lm.new_cache(B, L, skip_schedule=KEEP_ALL)
    lm.forward(ids, mask, cache=dual_cache)
    lm.forward(ids, mask, cache=es_cache)
    ids2 = advance(ids, start)
    for _ in range(2):  # two steps in a row: the second reads what the first wrote
        dual = lm.forward(ids2, mask, cache=dual_cache, mode=Dual(start=start, end=end, rows=rows_t))
        skip = skip_for(ids2[sel], start, end, KEEP_ALL, mask_id=lm.config.mask_id)
        es = lm.forward(
            ids2, mask, cache=es_cache, mode=EarlySkipping(start=start, end=end, rows=rows_t, skip=skip)
        )
        assert torch.allclose(es, dual, atol=1e-6, rtol=0)
        assert skip.computed_pairs == skip.full_pairs == LAYERS * (end - start)
        assert skip.kept.tolist() == [list(range(end - start))] * len(es)
        ids2[:, start + 2] = 44
    for a, b in zip(dual_cache.keys + dual_cache.values, es_cache.keys + es_cache.values):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_refresh_fills_the_hidden_states(deep_lms):
    lm = deep_lms["llada"]
    ids, mask, _, _ = canvas(lm, [5, 9])
    cache = lm.new_cache(*ids.shape, skip_schedule=DEFAULT_SCHEDULE)
    assert sorted(cache.hidden) == [1, 2, LAYERS]
    full = lm.forward(ids, mask, cache=cache)
    # By hand: the input of each layer, and the last layer's output.
    t = lm.model.model.transformer
    ctx = Context.build(mask, positions_from_mask(mask), lm.config.head_dim, lm.config.rope_theta)
    with torch.no_grad():
        x = t.wte(ids)
        inputs = []
        for i, block in enumerate(t.blocks):
            inputs.append(x)
            x = block(x, ctx, i)
        inputs.append(x)
        head = t.ff_out(t.ln_f(cache.hidden[LAYERS])).float()
    for level in cache.hidden:  # at real positions (padding ones are never read)
        assert torch.allclose(cache.hidden[level][mask], inputs[level][mask], atol=1e-5, rtol=0)
    assert torch.allclose(head, full, atol=1e-5, rtol=0)


def test_skipped_positions_keep_their_cached_state(lm):
    ids, mask, start, end = canvas(lm, [5, 9, 3])
    B, L = ids.shape
    extra = lm.model.extra_left
    cache = lm.new_cache(B, L, skip_schedule=DEFAULT_SCHEDULE)
    lm.forward(ids, mask, cache=cache)
    before = {level: h.clone() for level, h in cache.hidden.items()}
    keys_before = [k.clone() for k in cache.keys]

    ids2 = advance(ids, start)
    skip = skip_for(ids2, start, end, mask_id=lm.config.mask_id)
    logits = lm.forward(ids2, mask, cache=cache, mode=EarlySkipping(start=start, end=end, skip=skip))
    n = end - start
    assert skip.kept.shape == (B, math.ceil(0.25 * n))
    assert skip.computed_pairs == n + n // 2 + (LAYERS - 2) * math.ceil(0.25 * n) < skip.full_pairs

    with torch.no_grad():
        if lm.config.family == "llada":
            t = lm.model.model.transformer
            head = lambda h: t.ff_out(t.ln_f(h)).float()  # noqa: E731
        else:
            head = lambda h: lm.model.lm_head(lm.model.model.norm(h)).float()  # noqa: E731
    for b in range(B):
        kept = set(skip.kept[b].tolist())
        assert 1 in kept  # just committed: a forced keep
        skipped = [p for p in range(n) if p not in kept]
        for p in range(n):
            final_new, final_old = cache.hidden[LAYERS][b, start + p], before[LAYERS][b, start + p]
            k_new, k_old = cache.keys[-1][b, :, start + p], keys_before[-1][b, :, start + p]
            if p in skipped:
                assert torch.equal(final_new, final_old) and torch.equal(k_new, k_old)
            else:
                assert not torch.equal(final_new, final_old) and not torch.equal(k_new, k_old)
        # Half the block ran layer 1 (its K/V there are new), a superset of those that ran the last layer.
        ran_1 = {
            p
            for p in range(n)
            if not torch.equal(cache.keys[1][b, :, start + p], keys_before[1][b, :, start + p])
        }
        assert len(ran_1) == n // 2 and kept <= ran_1
        # A skipped position's hidden state feeds the head as cached (Dream: it predicts the next position).
        for p in skipped:
            if p + extra < n:
                expected = head(before[LAYERS][b, start + p])
                assert torch.allclose(logits[b, p + extra], expected, atol=1e-5, rtol=0)
        if extra:  # Dream's start-1 always runs every layer: the shift into the block stays current
            assert not torch.equal(cache.hidden[LAYERS][b, start - 1], before[LAYERS][b, start - 1])


def test_es_forward_is_row_independent(lm):
    ids, mask, start, end = canvas(lm, [5, 9, 3])
    B, L = ids.shape
    cache = lm.new_cache(B, L, skip_schedule=DEFAULT_SCHEDULE)
    lm.forward(ids, mask, cache=cache)
    ids2 = advance(ids, start)
    skip = skip_for(ids2, start, end, mask_id=lm.config.mask_id)
    together = lm.forward(ids2, mask, cache=cache, mode=EarlySkipping(start=start, end=end, skip=skip))
    for b in range(B):
        c1 = lm.new_cache(B, L, skip_schedule=DEFAULT_SCHEDULE)
        lm.forward(ids, mask, cache=c1)
        one = EarlySkip(
            skip.prev_confidence[b : b + 1], skip.just_committed[b : b + 1], skip.masked[b : b + 1]
        )
        alone = lm.forward(
            ids2, mask, cache=c1, mode=EarlySkipping(start=start, end=end, rows=torch.tensor([b]), skip=one)
        )
        assert torch.equal(one.kept[0], skip.kept[b])
        assert torch.allclose(alone[0], together[b], atol=1e-5, rtol=0)


def test_es_forward_errors(deep_lms):
    lm = deep_lms["llada"]
    ids, mask, start, end = canvas(lm, [5, 9])
    skip = skip_for(ids, start, end, mask_id=lm.config.mask_id)
    plain = lm.new_cache(*ids.shape)
    lm.forward(ids, mask, cache=plain)
    with pytest.raises(InputError, match=r"mode 'es' needs skip=EarlySkip\(...\), got NoneType"):
        lm.forward(ids, mask, cache=plain, mode=EarlySkipping(start=start, end=end))
    with pytest.raises(TypeError, match="Dual.__init__.. got an unexpected keyword argument 'skip'"):
        lm.forward(ids, mask, cache=plain, mode=Dual(start=start, end=end, skip=skip))
    with pytest.raises(InputError, match="mode 'es' needs a cache"):
        lm.forward(ids, mask, mode=EarlySkipping(start=start, end=end, skip=skip))
    with pytest.raises(InputError, match=r"no hidden states at layers \[1, 2, 8\].*skip_schedule"):
        lm.forward(ids, mask, cache=plain, mode=EarlySkipping(start=start, end=end, skip=skip))
    cache = lm.new_cache(*ids.shape, skip_schedule=DEFAULT_SCHEDULE)
    lm.forward(ids, mask, cache=cache)
    bad = skip_for(ids, start, end + 1, mask_id=lm.config.mask_id)
    with pytest.raises(InputError, match=r"skip.prev_confidence must be a tensor of shape \(2, 8\)"):
        lm.forward(ids, mask, cache=cache, mode=EarlySkipping(start=start, end=end, skip=bad))
    with pytest.raises(InputError, match=r"mode .es. needs skip=EarlySkip\(...\), got dict"):
        lm.forward(ids, mask, cache=cache, mode=EarlySkipping(start=start, end=end, skip={"masked": None}))
    with pytest.raises(InputError, match=r"schedule\[1\] keep fraction must be in \(0, 1\], got 1.5"):
        bad_schedule = skip_for(ids, start, end, ((1.0, 0.0), (1.5, 0.5)), mask_id=lm.config.mask_id)
        lm.forward(ids, mask, cache=cache, mode=EarlySkipping(start=start, end=end, skip=bad_schedule))
    with pytest.raises(InputError, match="skip_schedule"):
        lm.new_cache(2, 8, skip_schedule=[(0.5, 0.0)])


# ---- the engine ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fastdllm", "cai"])
def test_generation_with_keep_all_equals_dual(lm, method):
    dual = run(lm, PROMPTS, method, cache="dual", threshold=0.2, refresh_every=3)
    es = run(lm, PROMPTS, method, cache="es", es_schedule=KEEP_ALL, threshold=0.2, refresh_every=3)
    for a, b in zip(dual, es):
        assert a.token_ids == b.token_ids and a.nfe == b.nfe
        assert a.trace.commit_step == b.trace.commit_step
        assert a.computed_fraction == b.computed_fraction == 1.0


@pytest.mark.parametrize("method", ["es-dllm", "cai-es"])
def test_batch_invariance(lm, method):
    together = run(lm, PROMPTS, method, threshold=0.2, batch_size=4, early_stop=True)
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(lm, [prompt], method, threshold=0.2, early_stop=True)
        assert alone.token_ids == joint.token_ids
        assert alone.nfe == joint.nfe and alone.trace.commit_step == joint.trace.commit_step
        assert alone.computed_fraction == joint.computed_fraction < 1.0


class Recorder:
    """Wraps a model and records (block start, mode) of every forward."""

    def __init__(self, lm):
        self.lm, self.calls = lm, []

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def forward(self, ids, mask=None, cache=None, mode=None):
        (start,) = mode.start  # the engine passes one start per row; these tests decode one prompt
        self.calls.append((start, mode.name))
        return self.lm.forward(ids, mask, cache, mode)


@pytest.mark.parametrize("refresh_every", [None, 5, 0])
def test_refresh_cadence(lm, refresh_every):
    rec = Recorder(lm)
    # threshold 1.0: one token per step, so every block takes all 16 of its steps.
    (r,) = generate(
        rec,
        [PROMPTS[0]],
        method="es-dllm",
        gen_length=32,
        block_length=16,
        threshold=1.0,
        early_stop=False,
        refresh_every=refresh_every,
    )
    assert r.steps_per_block == [16, 16]
    f = refresh_every
    if f is None:  # the model default: the paper's f
        f = lm.config.cache_refresh_every
        assert f == {"llada": 16, "dream": 8}[lm.config.family]
    for block in range(2):
        modes = [mode for start, mode in rec.calls if start == len(PROMPTS[0]) + 16 * block]
        expected = ["full" if t == 0 or (f and t % f == 0) else "es" for t in range(16)]
        assert modes == expected
    # 8 layers, 16 positions: a skipping step runs 16 + 8 + 6 * 4 = 48 of 128 (layer, position) pairs.
    refreshes = sum(mode == "full" for _, mode in rec.calls)
    assert r.computed_fraction == pytest.approx((refreshes + (32 - refreshes) * 48 / 128) / 32)


@pytest.mark.parametrize(
    "method, cached, refreshes_inside",
    [
        ("fastdllm", "dual", False),
        ("fastdllm-prefix", "prefix", False),  # the official code: block starts only
        ("cai", "dual", True),
        ("es-dllm", "es", True),
        ("cai-es", "es", True),  # the paper's f
    ],
)
def test_which_presets_refresh_inside_a_block(lm, method, cached, refreshes_inside):
    rec = Recorder(lm)
    # threshold 1.0 (CAI: as a fixed threshold, gating off): one token per step, all 32 steps of each block,
    # so the model's f (16 LLaDA, 8 Dream) falls inside the block.
    (r,) = generate(
        rec,
        [PROMPTS[0]],
        method=method,
        gen_length=64,
        block_length=32,
        threshold=1.0,
        adaptive=False,
        gating=False,
        early_stop=False,
    )
    assert r.steps_per_block == [32, 32]
    f = lm.config.cache_refresh_every
    for block in range(2):
        modes = [mode for start, mode in rec.calls if start == len(PROMPTS[0]) + 32 * block]
        expected = ["full" if t == 0 or (refreshes_inside and t % f == 0) else cached for t in range(32)]
        assert modes == expected
    assert build_config(method, refresh_every=4).refresh_every == 4  # still overridable


def test_computed_fraction(lm):
    for method, cache in (("es-dllm", None), ("cai-es", None), ("fastdllm", "es")):
        for r in run(lm, PROMPTS, method, cache=cache):
            assert 0 < r.computed_fraction < 1
    for method, cache in (("fastdllm", None), ("cai", None), ("vanilla", None), ("fastdllm", "prefix")):
        for r in run(lm, PROMPTS, method, cache=cache):
            assert r.computed_fraction == 1.0


# ---- presets, config, API, CLI -------------------------------------------------------


def test_presets():
    es = build_config("es-dllm")
    own = es.cache_settings
    assert (es.policy, es.cache, es.policy_settings.threshold, own.schedule, own.alpha) == (
        "threshold",
        "es",
        0.9,
        DEFAULT_SCHEDULE,
        0.5,
    )
    cai_es = build_config("cai-es")
    assert (cai_es.policy, cai_es.cache) == ("cai", "es")
    assert build_config("cai").cache == "dual"  # the default backend is chosen after measuring
    custom = build_config("es-dllm", es_schedule=[[1, 0], [0.5, 0.5]], es_alpha=1)
    assert custom.cache_settings.schedule == ((1.0, 0.0), (0.5, 0.5)) and custom.cache_settings.alpha == 1.0
    nested = build_config("es-dllm", es={"schedule": [[1, 0], [0.5, 0.5]], "alpha": 1})  # the owner's key
    assert nested.cache_settings == custom.cache_settings


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(es_alpha=1.5), r"es_alpha must be in \[0, 1\], got 1.5"),
        (dict(es_alpha="high"), r"es_alpha must be in \[0, 1\]"),
        (dict(es_schedule=[]), "es_schedule must have at least one"),
        (dict(es_schedule=5), "es_schedule must be a sequence of"),
        (dict(es_schedule=[(1.0, 0.0), (0.5,)]), r"es_schedule\[1\] must be a pair of numbers"),
        (dict(es_schedule=[(0.5, 0.0)]), r"es_schedule\[0\] must be \(1.0, 0.0\)"),
        (
            dict(es_schedule=[(1.0, 0.0), (0.0, 0.5)]),
            r"es_schedule\[1\] keep fraction must be in \(0, 1\], got 0.0",
        ),
        (dict(es_schedule=[(1.0, 0.0), (0.5, 1.0)]), r"es_schedule\[1\] start must be in \[0, 1\)"),
        (dict(es_schedule=[(1.0, 0.0), (0.5, 0.5), (0.25, 0.25)]), "es_schedule starts must increase"),
        (dict(es_schedule=[(1.0, 0.0), (0.25, 0.25), (0.5, 0.5)]), "keep fractions must not increase"),
    ],
)
def test_bad_es_config(kwargs, message):
    with pytest.raises(InputError, match=message):
        build_config("es-dllm", **kwargs)


@pytest.mark.parametrize("method", ["es-dllm", "cai-es"])
def test_api(deep_lms, method):
    for lm in deep_lms.values():
        results = lm.generate(
            ["hello there", "what is the answer"], method=method, gen_length=16, block_length=8
        )
        for r in results:
            assert r.method == method and len(r.token_ids) == 16 and lm.config.mask_id not in r.token_ids
            assert r.to_dict()["computed_fraction"] == r.computed_fraction


@pytest.mark.parametrize(
    "args", [["--method", "es-dllm"], ["--method", "cai-es"], ["--method", "fastdllm", "--cache", "es"]]
)
def test_cli(deep_dirs, capsys, args):
    code = cli_main(
        [
            "generate",
            "hello",
            "--model",
            str(deep_dirs["llada"]),
            *args,
            "--gen-length",
            "16",
            "--block-length",
            "8",
            "--json",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert len(record["token_ids"]) == 16 and record["computed_fraction"] <= 1.0
    assert (
        cli_main(
            [
                "generate",
                "hello",
                "--model",
                str(deep_dirs["dream"]),
                *args,
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "forward passes" in capsys.readouterr().out
