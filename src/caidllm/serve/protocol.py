"""OpenAI request bodies in, checked decode requests out.

Every field is either honoured, accepted only at its neutral value (n=1,
top_p=1, no penalties, no logprobs, ...), or refused with a 400 naming it:
never silently ignored. caidllm's own settings come as top-level fields
(what the openai client sends with `extra_body`), named as generate()'s
keywords: method, gen_length, block_length, steps, cache, early_stop, and a
method's settings under its owner's key ("cai": {...}, "eb": {...}) or by
their flat names (theta_end, eb_gamma, ...), read from the methods'
declarations (decode/setting_names.py). A refusal's `param` is the field the
InputError names (error.field), never read from its text.
"""

from __future__ import annotations

from caidllm.checks import is_int, is_number
from caidllm.decode.block_diffusion import fit_to_model
from caidllm.decode.config import DecodeConfig
from caidllm.decode.nemotron import SEQUENTIAL_METHODS
from caidllm.decode.presets import build_config, decodes_one_block
from caidllm.decode.setting_names import ALL_NAMES
from caidllm.errors import InputError
from caidllm.models.families import get_family
from caidllm.serve import logprobs, structured, tools, uniform_protocol
from caidllm.serve.openai_fields import NEUTRAL
from caidllm.serve.prompt_input import check_prompt_lengths, check_text, messages_to_ids, prompts_to_ids
from caidllm.serve.request_types import DecodeRequest, RequestError, ServerDefaults
from caidllm.serve.stops import MAX_STOP_CHARS, MAX_STOP_SEQUENCES

OPENAI_FIELDS = {
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "messages",
    "prompt",
}
# caidllm's own top-level fields: the mask-based decoders' settings and the uniform-state ones' (each
# refused by name on a model whose decoders do not read it)
EXTENSIONS = (ALL_NAMES | uniform_protocol.SETTING_FIELDS | {"method"}) - {"temperature", "seed"}
OWN_FIELDS = {"commit_events", "logprobs", "top_logprobs", "echo", "tools", "tool_choice", *structured.FIELDS}


def parse(body, kind: str, lm, defaults: ServerDefaults) -> DecodeRequest:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    check_text(body)
    body = {k: v for k, v in body.items() if v is not None}
    prompt_field = "messages" if kind == "chat" else "prompt"
    _check_fields(body, kind, prompt_field)
    model = _model(body, defaults)
    stream, include_usage = _stream(body)
    max_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _positive_int(body, max_name)
    tool_request = _tools(body, lm, kind)
    prompts = (
        messages_to_ids(body["messages"], lm, defaults, tool_request)
        if kind == "chat"
        else prompts_to_ids(body["prompt"], lm, defaults)
    )
    check_prompt_lengths(prompts, defaults, prompt_field)
    extensions = {k: body[k] for k in body if k in EXTENSIONS}
    if get_family(lm.config.family).uniform:  # DiffusionGemma: its own decoders' settings
        config = _uniform_config(body, extensions, max_tokens, max_name, defaults, lm)
    else:
        try:
            uniform_protocol.refuse_uniform_fields(extensions, lm.config.family, ALL_NAMES)
        except InputError as error:
            raise RequestError(str(error), error.field) from None
        config = _config(body, extensions, max_tokens, max_name, defaults)
        try:  # the one check against the model: a setting its kind never reads, then one the method does not
            # read (whose advice is a method), then what the family does not take (cache=dual on block
            # diffusion)
            config = _fit(config, lm)
        except InputError as error:
            raise RequestError(str(error), error.field or _method_param(extensions)) from None
    constraint, top = _answer_form(body, kind, max_tokens, tool_request)
    return DecodeRequest(
        kind,
        prompts,
        config,
        max_tokens,
        _stop(body),
        stream,
        include_usage,
        _bool(body, "commit_events", False),
        model,
        extensions,
        constraint,
        top,
        tool_request,
    )


def _uniform_config(body, extensions: dict, max_tokens, max_name: str, defaults, lm):
    """A uniform-state model's settings (serve/uniform_protocol.py); a refusal names its field."""
    try:
        uniform_protocol.refuse_answer_form(body)
        return uniform_protocol.uniform_settings(body, extensions, max_tokens, max_name, defaults, lm)
    except InputError as error:
        raise RequestError(str(error), error.field or _method_param(extensions)) from None


def _check_fields(body: dict, kind: str, prompt_field: str) -> None:
    """Every field known to this endpoint, and well typed where the decoding ignores it; the prompt given."""
    other = "prompt" if kind == "chat" else "messages"
    for name, value in body.items():
        if name in NEUTRAL:
            problem = NEUTRAL[name].problem(value, kind)
            if problem:
                raise RequestError(problem, name)
        elif name == other or (name == "max_completion_tokens" and kind != "chat"):
            raise RequestError(f"{name!r} is not a field of this endpoint", name)
        elif name not in OPENAI_FIELDS | EXTENSIONS | OWN_FIELDS:
            raise RequestError(f"unknown field {name!r}", name)
    if prompt_field not in body:
        raise RequestError(f"{prompt_field!r} is required", prompt_field)


def _model(body: dict, defaults: ServerDefaults) -> str:
    """The model named (the served one when none is); another one: 404."""
    model = body.get("model", defaults.model_name)
    for name in ("model", "user"):
        if name in body and not isinstance(body[name], str):
            raise RequestError(f"{name} must be a string, got {_type(body[name])}", name)
    if model != defaults.model_name:
        raise RequestError(
            f"the model {model!r} does not exist; this server serves {defaults.model_name!r}",
            "model",
            status=404,
            code="model_not_found",
        )
    return model


def _stream(body: dict) -> tuple[bool, bool]:
    """stream, and stream_options' include_usage (only with stream: true)."""
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise RequestError("stream_options is only allowed with stream: true", "stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise RequestError("stream_options must be an object with only 'include_usage'", "stream_options")
        include_usage = _bool(options, "include_usage", False, "stream_options.include_usage")
    return stream, include_usage


def _answer_form(body: dict, kind: str, max_tokens, tool_request):
    """The answer's constraint (response_format, regex, choice, or a forced tool call) and its logprobs'
    count."""
    try:
        constraint = structured.constraint_of(body, max_tokens)
        top = logprobs.requested(body, kind)
    except (structured.RequestError, logprobs.LogprobsError) as error:
        raise RequestError(error.message, error.param) from None
    forced = tool_request.constraint(max_tokens) if tool_request is not None else None
    if forced is not None and constraint is not None:
        raise RequestError(
            "a forced tool call (tool_choice) cannot be combined with response_format, regex or choice",
            "tool_choice",
        )
    return constraint or forced, top


def _tools(body: dict, lm, kind: str):
    """The chat request's tools (serve/tools.py); None without them."""
    if kind != "chat":
        for name in ("tools", "tool_choice"):
            if name in body:
                raise RequestError(f"{name!r} is not a field of this endpoint", name)
        return None
    try:
        return tools.tool_request(body, lm)
    except tools.ToolError as error:
        raise RequestError(error.message, error.param) from None


def _method_param(extensions: dict) -> str | None:
    """The param of a refusal about no one field: the method, where the body names one."""
    return "method" if "method" in extensions else None


def _config(body, extensions: dict, max_tokens, max_name: str, defaults: ServerDefaults) -> DecodeConfig:
    ext = dict(extensions)
    method = ext.pop("method", defaults.method)
    block = ext.setdefault("block_length", defaults.block_length)
    if "gen_length" in ext:
        if max_tokens is not None and is_int(ext["gen_length"]) and max_tokens > ext["gen_length"]:
            raise RequestError(
                f"{max_name} ({max_tokens}) exceeds gen_length ({ext['gen_length']})", max_name
            )
    elif is_int(block) and block > 0:
        # The canvas: max_tokens rounded up to whole blocks, else the server default (whole blocks too);
        # exactly max_tokens for a method that decodes the whole canvas as one block (Elastic-Cache's
        # official loop), which the server's block default does not reach.
        # Integer arithmetic: a huge max_tokens must not overflow a float.
        wanted = max_tokens if max_tokens is not None else defaults.gen_length
        one_block = (
            max_tokens is not None and "block_length" not in extensions and decodes_one_block(method, **ext)
        )
        ext["gen_length"] = wanted if one_block else -(-wanted // block) * block
    gen_length = ext.get("gen_length")
    if is_int(gen_length) and gen_length > defaults.max_gen_length:
        param = "gen_length" if "gen_length" in extensions else max_name
        raise RequestError(
            f"the canvas of {gen_length} positions exceeds this server's limit of {defaults.max_gen_length}",
            param,
        )
    steps = ext.get("steps")
    if is_int(steps) and is_int(gen_length) and steps > gen_length:  # steps that commit nothing, for nothing
        raise RequestError(f"steps ({steps}) exceeds the canvas of {gen_length} positions", "steps")
    temperature = body.get("temperature", 0.0)
    if not is_number(temperature) or temperature < 0:
        raise RequestError(f"temperature must be a number >= 0, got {temperature!r}", "temperature")
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise RequestError(f"seed must be an integer, got {seed!r}", "seed")
    if method in SEQUENTIAL_METHODS:  # decode/nemotron.py's own settings (the engine checks the model)
        return _sequential(method, ext, float(temperature))
    try:
        own = (
            defaults.settings
            if defaults.settings is not None and defaults.settings.method == method
            else None
        )
        # The server's default block length is not the client's (Elastic-Cache's official loop refuses a given
        # one).
        filled = () if "block_length" in extensions else ("block_length",)
        # Lenient here: a setting of a method that does not run is refused by fit_to_model, after the model's
        # own refusals (a setting the model never reads is said so first).
        return build_config(
            method, settings=own, filled=filled, temperature=float(temperature), seed=seed, **ext
        )
    except InputError as error:
        raise RequestError(str(error), error.field or "method") from None


def _fit(config, lm):
    """The config fitted to the model: a mask-based decoder's (fit_to_model), or the sequential decoders'
    (decode/nemotron.py) on their family only (the server does not force them onto another)."""
    from caidllm.decode.nemotron import SEQUENTIAL_METHODS, SequentialSettings, untrained_refusal
    from caidllm.models.families import get_family

    sequential = get_family(lm.config.family).sequential
    if isinstance(config, SequentialSettings) and not sequential:
        raise InputError(untrained_refusal(lm.config.family, config.method).split("; pass force")[0])
    if sequential and not isinstance(config, SequentialSettings):
        raise InputError(
            f"model family {lm.config.family!r} decodes with its own decoders "
            f"{', '.join(map(repr, SEQUENTIAL_METHODS))}; method {config.method!r} is a mask-engine decoder"
        )
    return config if sequential else fit_to_model(config, lm.config, strict=True)


def _sequential(method: str, ext: dict, temperature: float):
    from caidllm.decode.nemotron import SequentialSettings, check_values

    unknown = sorted(set(ext) - {"gen_length", "block_length", "threshold", "early_stop"})
    if unknown:
        raise RequestError(f"{unknown[0]} does not apply to the sequential decoder {method!r}", unknown[0])
    if temperature != 0:
        raise RequestError("temperature: the sequential decoders are greedy only (0)", "temperature")
    try:
        return check_values(SequentialSettings(method=method, **ext))
    except InputError as error:
        raise RequestError(str(error), "method") from None


def _type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


def _stop(body) -> list[str]:
    stop = body.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(
            f"stop must be a non-empty string or a list of at most {MAX_STOP_SEQUENCES} of them", "stop"
        )
    if len(stop) > MAX_STOP_SEQUENCES:
        raise RequestError(f"stop holds {len(stop)} sequences; at most {MAX_STOP_SEQUENCES}", "stop")
    longest = max(stop, key=len, default="")
    if len(longest) > MAX_STOP_CHARS:
        raise RequestError(f"a stop sequence has {len(longest)} characters; at most {MAX_STOP_CHARS}", "stop")
    return stop


def _bool(body, name, default, label=None):
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(f"{label or name} must be true or false, got {value!r}", label or name)
    return value


def _positive_int(body, name):
    value = body.get(name)
    if value is not None and not (is_int(value) and value >= 1):
        raise RequestError(f"{name} must be a positive integer, got {value!r}", name)
    return value
