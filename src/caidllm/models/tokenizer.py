"""A PreTrainedTokenizerFast from a tokenizer and the settings of a
tokenizer_config.json; the end-of-turn tokens every family stops at."""

from __future__ import annotations

END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|role_end|>")  # LLaMA-3, ChatML (Qwen, SDAR), LLaDA2
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "additional_special_tokens")


def fast_tokenizer(tok_cfg: dict, chat_template, **source):
    """A PreTrainedTokenizerFast from `source` (tokenizer_file= or tokenizer_object=) with the
    special tokens and settings of a tokenizer_config.json dict."""
    from transformers import PreTrainedTokenizerFast

    kwargs = {k: _token_text(tok_cfg[k]) for k in SPECIAL_KEYS if tok_cfg.get(k) is not None}
    kwargs["chat_template"] = chat_template
    if "model_max_length" in tok_cfg:
        kwargs["model_max_length"] = tok_cfg["model_max_length"]
    kwargs["clean_up_tokenization_spaces"] = bool(tok_cfg.get("clean_up_tokenization_spaces", False))
    return PreTrainedTokenizerFast(**source, **kwargs)


def end_of_turn_ids(tokenizer) -> list[int]:
    """Ids of the END_OF_TURN tokens this tokenizer knows."""
    found = [tokenizer.convert_tokens_to_ids(t) for t in END_OF_TURN]
    return [i for i in found if i is not None and i != tokenizer.unk_token_id]


def _token_text(value):
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, list):
        return [_token_text(v) for v in value]
    return value
