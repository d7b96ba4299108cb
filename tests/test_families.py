"""The family registry: each family recognised by its config.json names, and an unknown
architecture refused with a line naming it and the families caidllm knows."""

import pytest

from caidllm.errors import ModelLoadError
from caidllm.models.families import FAMILIES, family_of, get_family


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_is_found_by_its_architectures_and_model_types(name):
    family = FAMILIES[name]
    for arch in family.architectures:
        assert family_of({"architectures": [arch]}) is family
    for model_type in family.model_types:
        # model_type compared lower-cased; alone, it names the first family (registry order) listing it
        first = next(f for f in FAMILIES.values() if model_type in f.model_types)
        assert family_of({"model_type": model_type.upper()}) is first
        assert family_of({"architectures": [family.architectures[0]], "model_type": model_type}) is family


def test_llada_moe_official_config_says_model_type_llada():
    assert family_of({"architectures": ["LLaDAMoEModelLM"], "model_type": "llada"}).name == "llada_moe"


def test_architectures_contradicting_model_type_are_refused():
    with pytest.raises(
        ModelLoadError,
        match="architectures \\['DreamModel'\\] name the dream family but "
        "model_type 'llada' names llada; the fields contradict",
    ):
        family_of({"architectures": ["DreamModel"], "model_type": "llada"})


def test_unknown_architecture_names_it_and_the_known_families():
    with pytest.raises(ModelLoadError) as e:
        family_of({"architectures": ["MysteryLM"], "model_type": "mystery"}, source="x/config.json")
    line = str(e.value)
    assert "\n" not in line and "x/config.json" in line and "MysteryLM" in line and "mystery" in line
    for family in FAMILIES.values():
        assert family.name in line and family.architectures[0] in line


def test_get_family_unknown_name():
    with pytest.raises(ModelLoadError, match="unknown model family 'gpt'; known: llada, dream"):
        get_family("gpt")


def test_llada_moe_dense_layers_first_then_moe():
    from caidllm.models.families import parse_config
    from caidllm.models.random_init import OFFICIAL

    raw = {
        **OFFICIAL["llada-moe-7b"],
        "num_hidden_layers": 3,
        "moe_layer_freq": [0, 1, 1],
        "mask_token_id": 5,
        "eos_token_id": 1,
    }
    config = parse_config(raw)
    assert config.dense_layers == 1 and config.intermediate_size == 8192 and config.moe.num_experts == 64
    with pytest.raises(ModelLoadError, match="a dense layer after an MoE one is not supported"):
        parse_config({**raw, "moe_layer_freq": [1, 0, 1]})
    with pytest.raises(
        ModelLoadError, match="must list 0 \\(dense\\) or 1 \\(MoE\\) for each of the 3 layers"
    ):
        parse_config({**raw, "moe_layer_freq": [1, 1]})
