"""The public checkpoints caidllm knows, and the decoding settings recommended for each.

Every value of a Recommendation names its source (the model card or paper it comes from);
the presets read them (recommended_options) when the caller leaves a setting unset, so
`caidllm generate --model DIR` decodes a known checkpoint as its authors do, and says so.
caidllm has no top-p / entropy ordering: where a card samples with them, the recommendation
stays greedy (temperature 0, as the CAI-dLLM paper evaluates) and the source says so.
A folder is recognised as a known checkpoint by (in this order) config.json's
"caidllm_checkpoint", the hub id it was loaded by, its folder name (a hub cache folder
models--ORG--NAME included) or config.json's "_name_or_path".
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .checkpoints_derived import DERIVED_ROWS
from .checkpoints_nemotron import NEMOTRON_ROWS

CAI_PAPER_LLADA = "CAI-dLLM paper: confidence gating on, f=16 for LLaDA"
CAI_PAPER_DREAM = "CAI-dLLM paper: confidence gating off, f=8 for Dream (Table 11)"


@dataclass(frozen=True)
class Recommendation:
    """Decoding settings of one checkpoint: lengths, steps and temperature from its card (or
    its family's), CAI's confidence gating and cache refresh period f from the CAI-dLLM paper."""

    gen_length: int
    block_length: int
    steps: int
    temperature: float
    confidence_gating: bool
    refresh_every: int  # f: full cache refresh every f steps in a block
    source: str
    # Block-diffusion checkpoints: the method preset of the official decoding and its confidence threshold
    # (`caidllm generate` runs them when --method / --threshold are not given).
    decoder: str | None = None
    threshold: float | None = None

    def decoding_options(self) -> dict:
        """The options generate() takes from it (gating and f go into the model's config)."""
        options = dict(
            gen_length=self.gen_length,
            block_length=self.block_length,
            steps=self.steps,
            temperature=self.temperature,
        )
        if self.threshold is not None:
            options["threshold"] = self.threshold
        return options

    def summary(self) -> str:
        decoder = f"method {self.decoder}, " if self.decoder else ""
        if self.decoder and self.threshold is not None:  # a quota decoder (sdar-static) has none
            decoder += f"threshold {self.threshold:g}, "
        return (
            f"{decoder}gen_length {self.gen_length}, block_length {self.block_length}, steps {self.steps}, "
            f"temperature {self.temperature:g}, confidence gating "
            f"{'on' if self.confidence_gating else 'off'}, "
            f"f {self.refresh_every}"
        )


@dataclass(frozen=True)
class Checkpoint:
    """One public checkpoint: its hub id, the random: shape of its official config (models/random_init.py),
    whether it is instruction-tuned (chat template by default) and how to decode it."""

    hub_id: str
    family: str
    shape: str
    instruct: bool
    recommended: Recommendation

    @property
    def name(self) -> str:
        return self.hub_id.split("/", 1)[1]

    def to_dict(self) -> dict:
        return {**asdict(self), "chat_by_default": self.instruct}


LLADA_CARD = Recommendation(
    gen_length=128,
    block_length=32,
    steps=128,
    temperature=0.0,
    confidence_gating=True,
    refresh_every=16,
    source="GSAI-ML/LLaDA-8B-Instruct model card and ML-GSAI/LLaDA generate.py (gen_length 128, steps 128, "
    f"block_length 32, temperature 0); {CAI_PAPER_LLADA}",
)
LLADA_MOE_CARD = replace(
    LLADA_CARD,
    source=(
        "inclusionAI/LLaDA-MoE-7B-A1B model cards (LLaDA's generate: gen_length 128, steps 128, "
        "block_length 32, "
        f"temperature 0); gating and f as LLaDA's ({CAI_PAPER_LLADA}; not measured on the MoE)"
    ),
)
MMADA_TEXT = replace(
    LLADA_CARD,
    source=(
        "MMaDA's text path is LLaDA's generate: LLaDA's card values (gen_length 128, steps 128, "
        "block_length 32, "
        f"temperature 0); {CAI_PAPER_LLADA} (not measured on MMaDA)"
    ),
)
DREAM_CARD = Recommendation(
    gen_length=512,
    block_length=32,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=8,
    source="Dream-org/Dream-v0-Instruct-7B model card (max_new_tokens 512, steps 512; its temperature 0.2 "
    "with "
    "top_p 0.95 needs top-p, which caidllm lacks: greedy, as the CAI-dLLM paper evaluates Dream); "
    f"block_length 32 (Dream's generate has no blocks); {CAI_PAPER_DREAM}",
)
DREAM_CODER_CARD = replace(
    DREAM_CARD,
    gen_length=768,
    steps=768,
    source=(
        "Dream-org/Dream-Coder-v0-Instruct-7B model card (max_new_tokens 768, steps 768; temperature 0.1 "
        "with "
        "top_p 0.95 and entropy ordering: greedy here, caidllm has no top-p); block_length 32; "
        f"gating and f as Dream's ({CAI_PAPER_DREAM}; not measured on Dream-Coder)"
    ),
)
DIFFUCODER_CARD = replace(
    DREAM_CARD,
    gen_length=256,
    steps=256,
    source=(
        "apple/DiffuCoder-7B-Instruct model card (max_new_tokens 256, steps 256 = one token per step; "
        "temperature 0.4 with top_p 0.95 and entropy ordering: greedy here, caidllm has no top-p); "
        f"block_length 32; gating and f as Dream's ({CAI_PAPER_DREAM}; not measured on DiffuCoder)"
    ),
)

# Block-diffusion checkpoints: their own decoders on the exact block cache. Confidence gating and f do not
# apply there (CAI on them runs with gating off, the family default; the block cache is never refreshed).
BLOCK_FAMILY_CAI = "gating off and f 16: the family defaults (the block cache is exact, f is never used)"
LLADA20_CARD = Recommendation(
    gen_length=512,
    block_length=32,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=16,
    decoder="llada2",
    threshold=0.95,
    source="inclusionAI/LLaDA2.0-mini and -flash model cards, Quickstart (generate: gen_length 512, "
    "block_length 32, "
    "steps 32 per block = 512 in all, temperature 0, eos_early_stop); threshold 0.95: the modeling file's "
    f"generate() default; {BLOCK_FAMILY_CAI}",
)
LLADA21_CARD = Recommendation(
    gen_length=256,
    block_length=32,
    steps=256,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=16,
    decoder="llada2.1-quality",
    threshold=0.7,
    source="inclusionAI/LLaDA2.1 model cards' quality mode as diffusers' LLaDA2Pipeline documents it "
    "(gen_length "
    "256, block_length 32, 32 steps per block = 256, threshold 0.7, editing_threshold 0.5, max_post_steps "
    "16, "
    "temperature 0; the speed mode is the llada2.1-speed preset, the official generate's own defaults "
    f"(0.95 / 0.9, no early stop) the llada2.1 preset); {BLOCK_FAMILY_CAI}",
)
# LLaDA2.0's lengths (gen_length 512, block 32, 32 steps per block), LLaDA2.2's decoder
LLADA22_CARD = replace(
    LLADA20_CARD,
    decoder="llada2.2",
    threshold=0.5,
    source="inclusionAI/LLaDA2.2-flash modeling file's generate() defaults as a public port quotes them "
    "(threshold 0.5, editing_threshold 0.0, block_length 32, steps 32 per block, max_post_steps 16, "
    "temperature 0) and SGLang's JointThresholdInDel defaults (threshold 0.5, edit_threshold 0, "
    "max_post_edit_steps 16); gen_length 512 is caidllm's (as LLaDA2.0's card); "
    f"{BLOCK_FAMILY_CAI}",
)
SDAR_SCRIPT = Recommendation(
    gen_length=512,
    block_length=4,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=16,
    decoder="sdar",
    threshold=0.85,
    source="JetAstra/SDAR generate.py defaults (block_length 4, denoising_steps 4 per block = 512 in all, "
    "low_confidence_dynamic, confidence_threshold 0.85); gen_length 512 is caidllm's (the script's 20480 is "
    "a "
    "ceiling); its temperature 1.0 samples: greedy here (top_k 1 in its reading), as the CAI-dLLM paper "
    f"evaluates; {BLOCK_FAMILY_CAI}",
)
FASTDLLM_V2_CARD = Recommendation(
    gen_length=512,
    block_length=32,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=16,
    decoder="fastdllm-v2",
    threshold=0.9,
    source="Efficient-Large-Model/Fast_dLLM_v2 model cards' example (generate: max_new_tokens 512, "
    "small_block_size "
    "8, threshold 0.9) and NVlabs Fast-dLLM v2/eval.py (bd_size 32, small_block_size 8, threshold 0.9); "
    "generate()'s temperature 0 (greedy); steps: at most one step per position (512); "
    f"{BLOCK_FAMILY_CAI}",
)

DIFFUSION_GEMMA_CARD = Recommendation(
    gen_length=256,
    block_length=256,
    steps=48,
    temperature=0.8,
    confidence_gating=False,
    refresh_every=0,
    decoder="diffusiongemma",
    source="google/diffusiongemma-26B-A4B-it generation_config.json, its model card's generate() defaults "
    "(canvas_length 256, max_denoising_steps 48, "
    "entropy_bound 0.1, t_max 0.8 -> t_min 0.4, stability_threshold 1, confidence_threshold 0.005); "
    "block_length is the canvas, steps the denoising steps per canvas, temperature the schedule's start",
)

KNOWN: tuple[Checkpoint, ...] = (
    Checkpoint("GSAI-ML/LLaDA-8B-Instruct", "llada", "llada-8b", True, LLADA_CARD),
    Checkpoint("GSAI-ML/LLaDA-8B-Base", "llada", "llada-8b", False, LLADA_CARD),
    Checkpoint("GSAI-ML/LLaDA-1.5", "llada", "llada-8b", True, LLADA_CARD),
    Checkpoint("Gen-Verse/MMaDA-8B-Base", "llada", "mmada-8b", False, MMADA_TEXT),
    Checkpoint("Gen-Verse/MMaDA-8B-MixCoT", "llada", "mmada-8b", True, MMADA_TEXT),
    Checkpoint("inclusionAI/LLaDA-MoE-7B-A1B-Base", "llada_moe", "llada-moe-7b", False, LLADA_MOE_CARD),
    Checkpoint("inclusionAI/LLaDA-MoE-7B-A1B-Instruct", "llada_moe", "llada-moe-7b", True, LLADA_MOE_CARD),
    Checkpoint("Dream-org/Dream-v0-Instruct-7B", "dream", "dream-7b", True, DREAM_CARD),
    Checkpoint("Dream-org/Dream-v0-Base-7B", "dream", "dream-7b", False, DREAM_CARD),
    Checkpoint("Dream-org/Dream-Coder-v0-Instruct-7B", "dream", "dream-coder-7b", True, DREAM_CODER_CARD),
    Checkpoint("apple/DiffuCoder-7B-Instruct", "dream", "diffucoder-7b", True, DIFFUCODER_CARD),
    Checkpoint("apple/DiffuCoder-7B-cpGRPO", "dream", "diffucoder-7b", True, DIFFUCODER_CARD),
    Checkpoint("inclusionAI/LLaDA2.0-mini", "llada2", "llada2-mini", True, LLADA20_CARD),
    Checkpoint("inclusionAI/LLaDA2.0-flash", "llada2", "llada2-flash", True, LLADA20_CARD),
    Checkpoint("inclusionAI/LLaDA2.1-mini", "llada2", "llada2.1-mini", True, LLADA21_CARD),
    Checkpoint("inclusionAI/LLaDA2.1-flash", "llada2", "llada2.1-flash", True, LLADA21_CARD),
    Checkpoint("inclusionAI/LLaDA2.2-flash", "llada2", "llada2.2-flash", True, LLADA22_CARD),
    Checkpoint("JetLM/SDAR-1.7B-Chat", "sdar", "sdar-1.7b", True, SDAR_SCRIPT),
    Checkpoint("JetLM/SDAR-4B-Chat", "sdar", "sdar-4b", True, SDAR_SCRIPT),
    Checkpoint("JetLM/SDAR-8B-Chat", "sdar", "sdar-8b", True, SDAR_SCRIPT),
    Checkpoint("JetLM/SDAR-30B-A3B-Chat", "sdar", "sdar-30b-a3b", True, SDAR_SCRIPT),
    Checkpoint(
        "Efficient-Large-Model/Fast_dLLM_v2_1.5B", "fastdllm_v2", "fastdllm-v2-1.5b", True, FASTDLLM_V2_CARD
    ),
    Checkpoint(
        "Efficient-Large-Model/Fast_dLLM_v2_7B", "fastdllm_v2", "fastdllm-v2-7b", True, FASTDLLM_V2_CARD
    ),
    Checkpoint(
        "google/diffusiongemma-26B-A4B-it",
        "diffusion_gemma",
        "diffusiongemma-26b-a4b",
        True,
        DIFFUSION_GEMMA_CARD,
    ),
)
# The 2026 checkpoints that reuse these architectures (or need a small family of their own): their rows and
# sources live in checkpoints_derived.py.
KNOWN += tuple(
    Checkpoint(hub_id, family, shape, instruct, Recommendation(**settings))
    for hub_id, family, shape, instruct, settings in DERIVED_ROWS + NEMOTRON_ROWS
)

# Quantized variants caidllm does not load (their weights need compressed-tensors / ModelOpt kernels it
# has not), each refused by name with the checkpoint to use instead.
REFUSED_VARIANTS = {
    "RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic": (
        "FP8 (compressed-tensors)",
        "google/diffusiongemma-26B-A4B-it",
    ),
    "RedHatAI/diffusiongemma-26B-A4B-it-NVFP4": (
        "NVFP4 (compressed-tensors)",
        "google/diffusiongemma-26B-A4B-it",
    ),
    "nvidia/diffusiongemma-26B-A4B-it-NVFP4": ("NVFP4 (ModelOpt)", "google/diffusiongemma-26B-A4B-it"),
}


def refused_variant(name) -> str | None:
    """The one-line refusal of a quantized variant named by hub id (exactly, first) or by its folder / bare
    name."""
    text = str(name).split("@", 1)[0].rstrip("/\\").lower()
    exact = [h for h in REFUSED_VARIANTS if h.lower() == text]
    by_name = [h for h in REFUSED_VARIANTS if re.split(r"[/\\]|--", text)[-1] == h.split("/")[1].lower()]
    for hub_id in exact or by_name[:1]:
        kind, instead = REFUSED_VARIANTS[hub_id]
        return (
            f"{hub_id}: its {kind} weights are not loaded by caidllm; load {instead} (bf16), with "
            "--quantize for quantized weights"
        )
    return None


BY_HUB_ID = {c.hub_id.lower(): c for c in KNOWN}
BY_NAME = {c.name.lower(): c for c in KNOWN}


def find_checkpoint(name: str) -> Checkpoint | None:
    """The known checkpoint of a hub id ("ORG/NAME", any case, "@revision" ignored) or a bare NAME."""
    name = name.split("@", 1)[0].strip().lower()
    return BY_HUB_ID.get(name) or BY_NAME.get(name)


def identify(folder: Path | None, raw: dict, hub_id: str | None = None) -> Checkpoint | None:
    """Which known checkpoint a loaded folder is (see the module docstring), or None."""
    candidates = [raw.get("caidllm_checkpoint"), hub_id]
    if folder is not None:
        cache = re.search(r"models--([^/\\]+?)--([^/\\]+)", str(folder))  # a huggingface_hub cache snapshot
        candidates += [f"{cache.group(1)}/{cache.group(2)}" if cache else None, Path(folder).name]
    candidates.append(str(raw.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1] or None)
    for candidate in candidates:
        if isinstance(candidate, str) and (found := find_checkpoint(candidate)) is not None:
            return found
    return None


def recommended_method(checkpoint: Checkpoint | None, given: str | None) -> str:
    """The method preset to run: the one given, else the checkpoint's own decoder, else cai."""
    return given or (checkpoint.recommended.decoder if checkpoint is not None else None) or "cai"


def recommended_options(
    checkpoint: Checkpoint | None, method: str | None = None, **given
) -> tuple[dict, list[str]]:
    """The decoding options with every unset one (None) taken from the checkpoint's
    recommendation; returns them and the names of those taken (empty when none was). The
    threshold is taken only where the caller passes one (None) and runs the checkpoint's own
    decoder (`method`)."""
    if checkpoint is None:
        return given, []
    options, taken = dict(given), []
    recommended = checkpoint.recommended.decoding_options()
    if "threshold" not in given or method != checkpoint.recommended.decoder:
        recommended.pop("threshold", None)
    if options.get("gen_length") is not None:
        # The recommended steps go with the recommended length only; a block must divide the length.
        recommended.pop("steps")
        if options["gen_length"] % recommended["block_length"]:
            recommended.pop("block_length")
    for key, value in recommended.items():
        if options.get(key) is None:
            options[key] = value
            taken.append(key)
    return options, taken
