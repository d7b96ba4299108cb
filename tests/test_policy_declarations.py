"""What block diffusion asks of a policy is declared on its registry entry (PolicySpec.models,
PolicySpec.block_causal_method), not listed in decode/block_diffusion.py: a decoder added with its
registry line alone is refused on the models it does not run on, and advised by its own entry."""

import pytest

from caidllm.decode import methods
from caidllm.decode.block_diffusion import ModelTraits, applicable, fit_to_model
from caidllm.decode.config import DecodeConfig
from caidllm.decode.policies import POLICIES, PolicySpec, vanilla
from caidllm.errors import InputError
from caidllm.setting_rules import BLOCK_CAUSAL

FULL = ModelTraits("llada", False)
BLOCK_MODEL = ModelTraits("tiny-bd", True, (4,))


@pytest.fixture
def new_decoders(monkeypatch):
    """Two decoders added by their registry lines only: a block-diffusion model's own, and a rule whose
    block-causal preset is 'vanilla'; and a preset of the first."""
    monkeypatch.setitem(POLICIES, "own-block", PolicySpec(vanilla.select, state_names=("n_masked",),
                                                          models=BLOCK_CAUSAL))
    monkeypatch.setitem(POLICIES, "any-model", PolicySpec(vanilla.select, state_names=("n_masked",),
                                                          block_causal_method="vanilla"))
    monkeypatch.setitem(methods.PRESETS, "own-block-preset",
                        {"policy": "own-block", "cache": "block", "block_length": 4})


def test_a_block_diffusion_decoder_is_refused_on_a_full_sequence_model(new_decoders):
    config = DecodeConfig(method="own-block-preset", policy="own-block", cache="none", block_length=4,
                          gen_length=16, given=("policy",)).validate()
    with pytest.raises(InputError, match="is a block-diffusion decoder") as info:
        fit_to_model(config, FULL)
    assert info.value.field == "policy"
    assert fit_to_model(config, BLOCK_MODEL).policy == "own-block"


def test_its_preset_is_listed_for_block_causal_models_only(new_decoders):
    assert "own-block-preset" not in methods.method_names(block_causal=False)
    assert "own-block-preset" in methods.method_names()
    assert "own-block-preset" in applicable(BLOCK_MODEL)[0]
    assert "own-block-preset" not in applicable(FULL)[0]


def test_a_method_cache_on_a_block_causal_model_advises_the_policys_own_preset(new_decoders):
    config = DecodeConfig(method="x", policy="any-model", cache="es", block_length=4, gen_length=16,
                          given=("policy",)).validate()
    with pytest.raises(InputError, match="use method 'vanilla'") as info:
        fit_to_model(config, BLOCK_MODEL)
    assert info.value.field == "method"


@pytest.mark.parametrize("policy, advised", [
    ("threshold", "fastdllm"), ("cai", "cai"), ("vanilla", "vanilla"), ("random", "vanilla"), ("eb", "fastdllm")])
def test_the_registered_policies_advice_is_unchanged(policy, advised):
    config = DecodeConfig(method="x", policy=policy, cache="es", block_length=4, gen_length=16,
                          given=("policy",)).validate()
    with pytest.raises(InputError, match=f"use method '{advised}'"):
        fit_to_model(config, BLOCK_MODEL)


def test_the_advice_lists_the_block_diffusion_presets_from_the_registry(new_decoders):
    config = DecodeConfig(method="wino", policy="wino", cache="none", block_length=4, gen_length=16,
                          given=()).validate()
    with pytest.raises(InputError, match="needs bidirectional attention") as info:
        fit_to_model(config, BLOCK_MODEL)
    assert "own-block-preset" in str(info.value) and "llada2" in str(info.value)


def test_a_cache_refusal_lists_the_caches_the_model_takes():
    with pytest.raises(InputError) as info:
        fit_to_model(DecodeConfig(cache="dual", block_length=4, gen_length=16, given=("cache",)), BLOCK_MODEL)
    assert info.value.field == "cache" and str(info.value).endswith("none, block, subblock")
