"""Shared fixtures: tiny random checkpoints in the official LLaDA / Dream
layout (tests/helpers/checkpoints.py), written once per session, and fp32 CPU
models loaded from them."""

import os

import pytest

# Tests never reach a hub: the Hugging Face libraries answer from their cache or fail at once
# (set before any test module imports them; their hub code paths are tested on local files).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import torch

import caidllm
from helpers.checkpoints import write_random_checkpoint


@pytest.fixture(scope="session")
def random_checkpoint(tmp_path_factory):
    """Factory: random_checkpoint(family="llada", **kwargs) -> a fresh folder
    (kwargs as for write_random_checkpoint)."""

    def make(family="llada", **kwargs):
        return write_random_checkpoint(tmp_path_factory.mktemp(f"ckpt_{family}"), family, **kwargs)

    return make


@pytest.fixture(scope="session")
def llada_dir(random_checkpoint):
    return random_checkpoint("llada")


@pytest.fixture(scope="session")
def dream_dir(random_checkpoint):
    return random_checkpoint("dream")


@pytest.fixture(scope="session")
def llada_lm(llada_dir):
    return caidllm.load(llada_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def dream_lm(dream_dir):
    return caidllm.load(dream_dir, device="cpu", dtype="float32")


@pytest.fixture(params=["llada", "dream"])
def lm(request, llada_lm, dream_lm):
    """Each test that takes `lm` runs on both families (a module may define its own `lm`)."""
    return llada_lm if request.param == "llada" else dream_lm


@pytest.fixture(scope="session")
def block_family(tmp_path_factory):
    """Factory: block_family("llada2" | "sdar" | "sdar-moe" | "fastdllm_v2") -> a tiny random fp32 CPU model
    of that block-diffusion layout (tests/block_checkpoints.py; LLaDA2 decodes blocks of 4 and 8), made
    once."""
    from block_checkpoints import write_block_checkpoint

    made = {}

    def get(kind):
        if kind not in made:
            overrides = {"llada2": {"caidllm_block_lengths": [4, 8]}, "fastdllm_v2": {"bd_size": 4}}.get(kind)
            folder = write_block_checkpoint(
                tmp_path_factory.mktemp(kind), kind, seed=11, config_overrides=overrides
            )
            made[kind] = caidllm.load(folder, device="cpu", dtype="float32")
        return made[kind]

    return get


@pytest.fixture(scope="module")
def tiny():
    """The shipped tiny model, fp32 on the CPU (a module that needs another tiny defines its own)."""
    return caidllm.load("tiny", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def bd_llada(random_checkpoint):
    """A block-causal LLaDA-layout model (tiny-bd's layout), its head sharpened so confidences spread (the
    S2D2 tests' third kind)."""
    folder = random_checkpoint(
        "llada", config_overrides={"caidllm_block_causal": True, "caidllm_block_lengths": [4, 8]}, seed=5
    )
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    with torch.no_grad():
        lm.model.model.transformer.ff_out.weight.mul_(8)
    return lm
