"""What block diffusion asks of a policy is declared on its registry entry (PolicySpec.models,
PolicySpec.block_causal_method), not listed in decode/block_diffusion.py: a decoder added with its
registry line alone is refused on the models it does not run on, and advised by its own entry."""

from pathlib import Path

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
    monkeypatch.setitem(
        POLICIES, "own-block", PolicySpec(vanilla.select, state_names=("n_masked",), models=BLOCK_CAUSAL)
    )
    monkeypatch.setitem(
        POLICIES,
        "any-model",
        PolicySpec(vanilla.select, state_names=("n_masked",), block_causal_method="vanilla"),
    )
    monkeypatch.setitem(
        methods.PRESETS, "own-block-preset", {"policy": "own-block", "cache": "block", "block_length": 4}
    )


def test_a_block_diffusion_decoder_is_refused_on_a_full_sequence_model(new_decoders):
    config = DecodeConfig(
        method="own-block-preset",
        policy="own-block",
        cache="none",
        block_length=4,
        gen_length=16,
        given=("policy",),
    ).validate()
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
    config = DecodeConfig(
        method="x", policy="any-model", cache="es", block_length=4, gen_length=16, given=("policy",)
    ).validate()
    with pytest.raises(InputError, match="use method 'vanilla'") as info:
        fit_to_model(config, BLOCK_MODEL)
    assert info.value.field == "method"


@pytest.mark.parametrize(
    "policy, advised",
    [
        ("threshold", "fastdllm"),
        ("cai", "cai"),
        ("vanilla", "vanilla"),
        ("random", "vanilla"),
        ("eb", "fastdllm"),
    ],
)
def test_the_registered_policies_advice_is_unchanged(policy, advised):
    config = DecodeConfig(
        method="x", policy=policy, cache="es", block_length=4, gen_length=16, given=("policy",)
    ).validate()
    with pytest.raises(InputError, match=f"use method '{advised}'"):
        fit_to_model(config, BLOCK_MODEL)


def test_the_advice_lists_the_block_diffusion_presets_from_the_registry(new_decoders):
    config = DecodeConfig(
        method="wino", policy="wino", cache="none", block_length=4, gen_length=16, given=()
    ).validate()
    with pytest.raises(InputError, match="needs bidirectional attention") as info:
        fit_to_model(config, BLOCK_MODEL)
    assert "own-block-preset" in str(info.value) and "llada2" in str(info.value)


def test_a_cache_refusal_lists_the_caches_the_model_takes():
    with pytest.raises(InputError) as info:
        fit_to_model(DecodeConfig(cache="dual", block_length=4, gen_length=16, given=("cache",)), BLOCK_MODEL)
    assert info.value.field == "cache" and str(info.value).endswith("none, block, subblock")


# A decoder with settings: its one file (policies/top.py) and its registry line, added to a copy of the
# package as a source edit would be; the keywords, the owner's key, the flat name, the refusals naming the
# field, `caidllm models`' table and the server's fields follow from the declaration alone.
TOP_FILE = """
import dataclasses
from typing import ClassVar

from caidllm.decode.policies.base import PolicySettings, with_most_confident
from caidllm.setting_rules import Rule, positive_int


@dataclasses.dataclass
class TopSettings(PolicySettings):
    k: int = 2
    OWNER: ClassVar[str] = "top"
    TITLE: ClassVar[str] = "the k most confident"
    LEGACY: ClassVar[dict[str, str]] = {"top_k_old": "k"}
    RULES: ClassVar[tuple[Rule, ...]] = (Rule("k", "a positive integer", positive_int),)

    def arguments(self, gating):
        return dict(k=self.k)


def select(view, k):
    ranks = view.confidence.masked_fill(~view.masked, -1).argsort(dim=1, descending=True).argsort(dim=1)
    return with_most_confident(view.masked & (ranks < k), view)
"""
REGISTRY_LINE = """
from caidllm.decode.policies import top  # noqa: E402
POLICIES["top"] = PolicySpec(top.select, top.TopSettings)
"""
CHECKS = """
from caidllm.decode import build_config
from caidllm.decode.methods import PRESETS
from caidllm.decode.setting_names import settings_lines
from caidllm.errors import InputError
from caidllm.serve.protocol import EXTENSIONS

PRESETS["top"] = dict(policy="top", cache="none")
assert build_config("top", top={"k": 3}).policy_settings.k == 3
assert build_config("top", top_k_old=4).policy_settings.k == 4
for method, given, field, said in (
        ("top", {"top": {"k": 0}}, "top", "top.k must be a positive integer"),
        ("top", {"top_k_old": 0}, "top_k_old", "top_k_old must be a positive integer"),
        ("vanilla", {"top_k_old": 2}, "top_k_old", "read only by policy 'top'")):
    try:
        build_config(method, strict=True, **given)
        raise SystemExit(f"{given} not refused")
    except InputError as error:
        assert error.field == field and said in str(error), (error.field, str(error))
assert any(line.strip().startswith("top.k ") for line in settings_lines())
assert {"top", "top_k_old"} <= EXTENSIONS
print("ok")
"""


def test_a_decoder_with_settings_is_its_file_and_its_registry_line(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    import caidllm

    source = Path(caidllm.__file__).parent
    copy = tmp_path / "src" / "caidllm"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    (copy / "assets").symlink_to(source / "assets")
    (copy / "decode" / "policies" / "top.py").write_text(TOP_FILE)
    with open(copy / "decode" / "policies" / "__init__.py", "a") as registry:
        registry.write(REGISTRY_LINE)
    run = subprocess.run(
        [sys.executable, "-c", CHECKS],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "src")},
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
