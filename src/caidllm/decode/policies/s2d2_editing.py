"""S2D2 with LLaDA2.1's token editing: LLaDA2's loop (phymhan/S2D2 LLaDA2/generate_utils.py
``generate_ssd_policy``, the paper's LLaDA2.1-Mini configurations).

Each step the engine's token editing (decode/block_diffusion.py: ``edits``) rewrites committed positions of
the block that are not the prompt's, whose draft differs with probability above ``editing_threshold``;
the edits are made before verification, and the verify forward reads the block with the draft filled in
and the edits applied (decode/runner.py: SelfSpec.edits). The router decides at every step, an editing
step with no mask left too (there the score is -inf: the hysteresis switch turns off), the fallback fills
the fixed quota (``num_to_transfer``, the edits not counted), and a block ends by the editing rule
(``max_post_steps``). The loop has none of SDAR's extra options: they are refused with editing.
"""

from __future__ import annotations

from caidllm.errors import InputError
from caidllm.setting_rules import named

# SDAR's options that LLaDA2's loop (the one with token editing) has not: refused with editing_threshold.
NOT_IN_LLADA2 = {
    "ratio_threshold": lambda s: s.ratio_threshold >= 0,
    "always_check_high_confidence": lambda s: s.always_check_high_confidence,
    "resample": lambda s: not s.resample,
    "router": lambda s: s.router == "contextual_bandit_ucb",
    "sub_block": lambda s: s.sub_block is not None,
    "cache_ver": lambda s: s.cache_ver,
    "num_to_transfer": lambda s: s.num_to_transfer is None,
}


def check_editing(s, config) -> None:
    """Token editing with S2D2 is LLaDA2's loop (LLaDA2/generate_utils.py ``generate_ssd_policy``): its
    fixed quota, no option of SDAR's or Fast-dLLM v2's loop; InputError naming the field."""
    for key, on in NOT_IN_LLADA2.items():
        if on(s):
            name, field_ = named(config.labels, f"s2d2.{key}")
            value = getattr(s, key)
            raise InputError(
                f"{name}={value!r} does not apply with editing_threshold: S2D2 with token editing is "
                "LLaDA2's loop (LLaDA2/generate_utils.py), which has no such option"
                + (" (it needs a fixed quota)" if key == "num_to_transfer" else ""),
                field=field_,
            )
