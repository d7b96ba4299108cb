"""A request body's decode settings on a uniform-state model (DiffusionGemma): DiffusionGemmaSettings, each
knob a checked top-level field (decode/diffusiongemma_settings.py), the OpenAI `seed` its seed and
`max_tokens` its gen_length. What the uniform-state decoders do not read is refused with a 400 naming the
field: a mask-based decoder (`method`), a mask-based decoder's setting (block_length, steps, threshold, ...),
`temperature` (their temperature is the t_max -> t_min schedule), structured output and logprobs (not
implemented for them). The server's settings file (`caidllm serve --settings`, diffusiongemma-cai's) gives
the requests for its method their dgcai defaults; a request's own dgcai fields go over them."""

from __future__ import annotations

from caidllm.checks import is_int
from caidllm.decode.diffusiongemma_settings import FIELDS, UNIFORM_METHODS
from caidllm.decode.uniform_api import check_uniform
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS
from caidllm.errors import InputError

# the settings' own names, as request fields (seed is OpenAI's; method is every decoder's), and the keys a
# decoder's own settings go under ("dgcai": {...})
OWNER_KEYS = {d.settings.OWNER for d in UNIFORM_DECODERS.values() if d.settings is not None}
SETTING_FIELDS = (FIELDS - {"method", "seed"}) | OWNER_KEYS
# body fields the uniform-state decoders do not implement: the answer's form and its logprobs
NOT_IMPLEMENTED = ("response_format", "regex", "choice", "logprobs", "top_logprobs")


def uniform_settings(body: dict, extensions: dict, max_tokens, max_name: str, defaults, lm):
    """The checked DiffusionGemmaSettings of one request (InputError naming the field)."""
    ext = dict(extensions)
    method = ext.pop("method", None)
    if method is None:  # the server's default, when it is one of this family's decoders
        method = defaults.method if defaults.method in UNIFORM_METHODS else UNIFORM_METHODS[0]
    if not isinstance(method, str):
        raise InputError(f"method must be a string, got {method!r}", "method")
    if "temperature" in body:
        raise InputError(
            "temperature does not apply to the uniform-state decoders: their temperature is the linear "
            "schedule t_max -> t_min (fields t_max, t_min); method 'greedy' takes the argmax",
            "temperature",
        )
    ext["gen_length"] = _gen_length(ext, max_tokens, max_name, defaults, lm)
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise InputError(f"seed must be an integer, got {seed!r}", "seed")
    # the server's settings file (--settings): the defaults of a request for its method, under its own dgcai
    own = defaults.settings if getattr(defaults.settings, "method", None) == method else None
    settings = check_uniform(lm.config, method, getattr(lm, "path", None), seed=seed, settings=own, **ext)
    if settings.max_denoising_steps > defaults.max_gen_length:  # a request's forwards stay bounded
        raise InputError(
            f"max_denoising_steps {settings.max_denoising_steps} exceeds this server's limit of "
            f"{defaults.max_gen_length} (--max-gen-length: a mask-based request's most steps)",
            "max_denoising_steps",
        )
    return settings


def _gen_length(ext: dict, max_tokens, max_name: str, defaults, lm) -> int:
    """The answer's length: gen_length if given (at least max_tokens), else max_tokens, else the
    server's default; within the server's limit. A canvas is decoded whole, the answer trimmed to it."""
    if "gen_length" in ext:
        gen_length = ext["gen_length"]
        if max_tokens is not None and is_int(gen_length) and max_tokens > gen_length:
            raise InputError(f"{max_name} ({max_tokens}) exceeds gen_length ({gen_length})", max_name)
    else:
        gen_length = max_tokens if max_tokens is not None else defaults.gen_length
    if is_int(gen_length) and gen_length > defaults.max_gen_length:
        raise InputError(
            f"gen_length {gen_length} exceeds this server's limit of {defaults.max_gen_length}",
            "gen_length" if "gen_length" in ext else max_name,
        )
    return gen_length


def refuse_answer_form(body: dict) -> None:
    """Structured output and logprobs, not implemented for the uniform-state decoders: refused by field."""
    for name in NOT_IMPLEMENTED:
        if name in body and body[name] is not False:
            raise InputError(
                f"{name} is not implemented for the uniform-state decoders ({', '.join(UNIFORM_METHODS)})",
                name,
            )
    choice = body.get("tool_choice")
    if isinstance(choice, dict) or choice == "required":
        raise InputError(
            "a forced tool call (tool_choice) is not implemented for the uniform-state decoders: it holds "
            "the answer to a grammar, which only the mask-based decoders do",
            "tool_choice",
        )


def refuse_uniform_fields(extensions: dict, family: str, mask_names) -> None:
    """A uniform-state decoder's own setting sent to a model of a mask-based family: refused by name."""
    own = sorted(k for k in extensions if k in SETTING_FIELDS and k not in mask_names)
    if own:
        raise InputError(
            f"{own[0]!r} is a setting of the uniform-state decoders ({', '.join(UNIFORM_METHODS)}), which "
            f"do not run on model family {family!r} (it decodes with a mask token)",
            own[0],
        )
