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
        assert family_of({"model_type": model_type.upper()}) is family  # model_type compared lower-cased


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
