"""The 2026 checkpoints built on architectures caidllm already runs (issue 46): CAP-trained LLaDA2.0,
TraDo (SDAR trained with TraceRL), the distilled d3LLM and dParallel models (LLaDA / Dream), and the two
that needed a small family of their own, Stable-DiffCoder (models/stable_diffcoder.py) and RND1
(models/rnd1.py).

Plain rows (hub id, family, random: shape, instruct, Recommendation fields) that checkpoints.py turns
into its KNOWN table; kept apart so that each source can be read beside its values. Every value names
where it comes from; what the stored public copies do not give is said in the source. hao-ai-lab's
"SDAR-4B-Chat-distill" is on the hub (org d3LLM, the d3LLM-v2 collection) only as the task-distilled
SDAR-4B-Chat-distill-search and -webshop: those two are the rows (docs/models-derived.md).
"""

from __future__ import annotations

# The CAI-dLLM paper's gating and refresh period, as checkpoints.py states them for each family.
LLADA_CAI = "CAI-dLLM paper: confidence gating on, f=16 for LLaDA (not measured on this checkpoint)"
DREAM_CAI = "CAI-dLLM paper: confidence gating off, f=8 for Dream, Table 11 (not measured on this checkpoint)"
BLOCK_CAI = "gating off and f 16: the family defaults (the block cache is exact, f is never used)"
GREEDY = "greedy here (caidllm's recommendations are greedy, as the CAI-dLLM paper evaluates)"
NO_ENTROPY_THRESHOLD = (
    "its own decoder (commit every masked position whose entropy is below the threshold, "
    "at least one per block and step) is not a caidllm method: CAI by default"
)

LLADA2_GENERATE = dict(
    gen_length=512,
    block_length=32,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=16,
    decoder="llada2",
    threshold=0.95,
)
TRADO = dict(
    block_length=4, temperature=0.0, confidence_gating=False, refresh_every=16, decoder="sdar", threshold=0.9
)
TRADO_SOURCE = (
    "Gen-Verse/dLLM-RL {config} (block_size 4, denoising_steps_per_block 4 = {steps} steps for max_token "
    "{steps}, remasking_strategy low_confidence_dynamic, dynamic_threshold 0.9) and its README's "
    "block_diffusion_generate example (block_length 4, denoising_steps 4, confidence_threshold 0.9, mask_id "
    f"151669); their temperature 1.0 samples: {GREEDY}; the SDAR architecture (model_base 'trado' runs as "
    f"SDAR), shape of {{base}} (TraDo's own config.json is not in the stored copies; TraDo-8B-Instruct's hub "
    "file list: model type sdar, 16.4 GB of safetensors as SDAR-8B-Chat's, its chat template in "
    f"chat_template.jinja); {BLOCK_CAI}"
)
# d3LLM-v2's SDAR students: their hub pages (d3LLM org) give the name, the size and a chat usage, nothing
# of the decoding or config.json: SDAR-4B-Chat's shape and JetAstra/SDAR generate.py's defaults.
SDAR_DISTILL = dict(TRADO, gen_length=512, steps=512, threshold=0.85)
SDAR_DISTILL_SOURCE = (
    "d3LLM/SDAR-4B-Chat-distill-{task} hub page (hao-ai-lab's d3LLM-v2: SDAR-4B-Chat distilled for "
    "the {task} agent task, 4B, chat usage); its decoding settings, config.json and chat template are "
    "not in the stored copies: SDAR-4B-Chat's shape and JetAstra/SDAR generate.py defaults "
    "(block_length 4, denoising_steps 4 per block = 512 in all, low_confidence_dynamic, "
    "confidence_threshold 0.85; gen_length 512 is caidllm's; its temperature 1.0 samples: "
    f"{GREEDY}); a downloaded folder is built from its own config.json (block_size included); "
    f"{BLOCK_CAI}"
)
STABLE_DIFFCODER = dict(
    gen_length=512,
    block_length=4,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=16,
    decoder="sdar-static",
    threshold=None,
    source="ByteDance-Seed/Stable-DiffCoder README and model card (generate: steps 512, gen_length 512, "
    "block_length 4, temperature 0, remasking low_confidence, threshold None: a fixed quota per step, "
    "one token at 4 steps per block of 4 = the sdar-static preset; shift False; mask_id 5 as the "
    f"modeling file's generate_block default); the Base card's own example is not in the stored "
    f"copies; {BLOCK_CAI}",
)

DERIVED_ROWS: tuple[tuple[str, str, str, bool, dict], ...] = (
    (
        "inclusionAI/LLaDA2.0-mini-CAP",
        "llada2",
        "llada2-mini",
        True,
        dict(
            LLADA2_GENERATE,
            source="inclusionAI/LLaDA2.0-mini-CAP model card (LLaDA2.0-mini with Confidence-Aware Parallel "
            "training, 16B-A1B: the llada2-mini shape; its Quickstart is not in the stored copies): "
            "LLaDA2.0's generate (gen_length 512, block_length 32, 32 steps per block = 512, temperature "
            f"0, threshold 0.95: the modeling file's generate() default); {BLOCK_CAI}",
        ),
    ),
    (
        "inclusionAI/LLaDA2.0-flash-CAP",
        "llada2",
        "llada2-flash",
        True,
        dict(
            LLADA2_GENERATE,
            source="inclusionAI/LLaDA2.0-flash-CAP (its model card is not in the stored copies; the LLaDA2.0 "
            "report and SGLang's day-0 LLaDA 2.0 post name it the CAP version of the 100B flash, run at "
            "threshold 0.95): the llada2-flash shape, LLaDA2.0's generate (gen_length 512, block_length "
            f"32, 32 steps per block = 512, temperature 0, threshold 0.95: the modeling file's "
            f"generate() default); {BLOCK_CAI}",
        ),
    ),
    (
        "Gen-Verse/TraDo-4B-Instruct",
        "sdar",
        "sdar-4b",
        True,
        dict(
            TRADO,
            gen_length=2000,
            steps=2000,
            source=TRADO_SOURCE.format(config="configs/trado_eval.yaml", steps=2000, base="SDAR-4B-Chat"),
        ),
    ),
    (
        "Gen-Verse/TraDo-8B-Instruct",
        "sdar",
        "sdar-8b",
        True,
        dict(
            TRADO,
            gen_length=2000,
            steps=2000,
            source=TRADO_SOURCE.format(config="configs/trado_eval.yaml", steps=2000, base="SDAR-8B-Chat"),
        ),
    ),
    (
        "Gen-Verse/TraDo-8B-Thinking",
        "sdar",
        "sdar-8b",
        True,
        dict(
            TRADO,
            gen_length=10000,
            steps=10000,
            source=TRADO_SOURCE.format(
                config="configs/trado_longcot_eval.yaml (start_with_think: the answer "
                "opens with <think>; stop at <|im_end|>)",
                steps=10000,
                base="SDAR-8B-Chat",
            ),
        ),
    ),
    *(
        (
            f"d3LLM/SDAR-4B-Chat-distill-{task}",
            "sdar",
            "sdar-4b",
            True,
            dict(SDAR_DISTILL, source=SDAR_DISTILL_SOURCE.format(task=task)),
        )
        for task in ("search", "webshop")
    ),
    (
        "d3LLM/d3LLM_LLaDA",
        "llada",
        "llada-8b",
        True,
        dict(
            gen_length=256,
            block_length=32,
            steps=256,
            temperature=0.0,
            confidence_gating=True,
            refresh_every=16,
            source="hao-ai-lab/d3LLM chat/chat_d3llm_llada.py's generate settings (max_new_tokens 256, steps "
            f"256, block_size 32, temperature 0; threshold 0.5 of its multi-block decoding); "
            f"{NO_ENTROPY_THRESHOLD}; LLaDA-8B-Instruct's shape (d3llm_train.yaml distils it); "
            f"{LLADA_CAI}",
        ),
    ),
    (
        "d3LLM/d3LLM_Dream",
        "dream",
        "dream-7b",
        True,
        dict(
            gen_length=256,
            block_length=32,
            steps=256,
            temperature=0.0,
            confidence_gating=False,
            refresh_every=8,
            source="hao-ai-lab/d3LLM chat/chat_d3llm_dream.py's generate settings (max_new_tokens 256, steps "
            f"256, block_size 32, temperature 0, alg entropy_threshold 0.5); {NO_ENTROPY_THRESHOLD}; "
            f"Dream-v0-Instruct-7B's shape (d3llm_train.yaml distils it); {DREAM_CAI}",
        ),
    ),
    (
        "d3LLM/d3LLM_Dream_Coder",
        "dream",
        "dream-coder-7b",
        True,
        dict(
            gen_length=512,
            block_length=32,
            steps=512,
            temperature=0.0,
            confidence_gating=False,
            refresh_every=8,
            source="hao-ai-lab/d3LLM eval_scripts/dream-coder.sh's generate settings (max_new_tokens 512, "
            "diffusion_steps 512, block_length 32, temperature 0, alg entropy_threshold 0.5); "
            f"{NO_ENTROPY_THRESHOLD}; Dream-Coder-v0-Instruct-7B's shape (the coder d3llm_train.yaml "
            f"distils it); {DREAM_CAI}",
        ),
    ),
    (
        "Zigeng/dParallel-LLaDA-8B-instruct",
        "llada",
        "llada-8b",
        True,
        dict(
            gen_length=256,
            block_length=32,
            steps=256,
            temperature=0.0,
            confidence_gating=True,
            refresh_every=16,
            source="czg1225/dParallel README Quick Start (LLaDA/generate.py's generate: steps 256, "
            "gen_length "
            "256, block_length 32, temperature 0, threshold 0.5 read as an entropy threshold); "
            f"{NO_ENTROPY_THRESHOLD}; LLaDA-8B-Instruct's shape (its distillation base); {LLADA_CAI}",
        ),
    ),
    (
        "Zigeng/dParallel_Dream_7B_Instruct",
        "dream",
        "dream-7b",
        True,
        dict(
            gen_length=256,
            block_length=32,
            steps=256,
            temperature=0.0,
            confidence_gating=False,
            refresh_every=8,
            source="czg1225/dParallel Dream/generate.py's diffusion_generate settings (max_new_tokens 256, "
            f"steps 256, temperature 0, alg entropy_threshold 0.5, block_length 32); "
            f"{NO_ENTROPY_THRESHOLD}; Dream-v0-Instruct-7B's shape (its distillation base); {DREAM_CAI}",
        ),
    ),
    (
        "ByteDance-Seed/Stable-DiffCoder-8B-Instruct",
        "stable_diffcoder",
        "stable-diffcoder-8b",
        True,
        STABLE_DIFFCODER,
    ),
    (
        "ByteDance-Seed/Stable-DiffCoder-8B-Base",
        "stable_diffcoder",
        "stable-diffcoder-8b",
        False,
        STABLE_DIFFCODER,
    ),
    (
        "radicalnumerics/RND1-Base-0910",
        "rnd1",
        "rnd1-30b-a3b",
        False,
        dict(
            gen_length=256,
            block_length=32,
            steps=256,
            temperature=0.0,
            confidence_gating=False,
            refresh_every=8,
            source="RadicalNumerics/RND1 README and demo_rnd_generation.py (generate: max_new_tokens 256, "
            "num_diffusion_steps 256; temperature 0.01 there, 0 here: greedy; its decoder keeps the "
            "highest-entropy masked positions masked on a linear schedule over the whole answer, one "
            "block: no caidllm method orders by entropy, CAI by default over blocks of 32 as Dream's "
            "row); a base model, prompted 'Question: ...\\nAnswer:' in its task mode; gating off, f 8: "
            "Dream's values, the other shifted AR-adapted family (not measured on RND1)",
        ),
    ),
)
