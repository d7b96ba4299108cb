"""The small generated tokenizer of `random:` models (and of the tests' random checkpoints).

A byte-level BPE of a few hundred tokens, built rather than trained (the same
every time): the family's special tokens first, then the 256 byte symbols,
then one merge chain per common English word. With it come the family's chat
template, its tokenizer_config.json and the config.json token-id fields.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .tokenizer import fast_tokenizer

SPECIAL_TOKENS = {
    "llada": [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|mdm_mask|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"],
}

# Words that get their own BPE token (with and without a leading space);
# everything else falls back to single bytes, so any text round-trips.
WORDS = (
    "the a an is are was of to and in on for it that this with as be what how many "
    "answer question user assistant system you he she they we has have had more less "
    "than total each per so then if not yes no true false step"
).split()

LLADA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
DREAM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set turns = "
    "messages[1:] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% set turns = messages %}{% endif %}"
    "<|im_start|>system\n{{ system }}<|im_end|>\n"
    "{% for message in turns %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% "
    "endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def special_ids(family: str) -> dict[str, int]:
    """Special token -> id (the special tokens take the smallest ids, in order)."""
    return {t: i for i, t in enumerate(SPECIAL_TOKENS[family])}


def config_token_ids(family: str) -> dict[str, int]:
    """The config.json token-id fields as the official checkpoints spell them."""
    ids = special_ids(family)
    if family == "llada":
        eos = ids["<|endoftext|>"]
        return {"eos_token_id": eos, "mask_token_id": ids["<|mdm_mask|>"], "pad_token_id": eos}
    eos = ids["<|endoftext|>"]
    return {"bos_token_id": eos, "eos_token_id": eos, "mask_token_id": ids["<|mask|>"], "pad_token_id": eos}


def tokenizer_config(family: str, max_length: int) -> dict:
    """tokenizer_config.json of the family (without added_tokens_decoder)."""
    if family == "llada":
        return {
            "add_bos_token": False,
            "add_eos_token": False,
            "bos_token": "<|startoftext|>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "chat_template": LLADA_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_length,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
    return {
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": DREAM_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }


def generated_tokenizer(family: str, max_length: int):
    """The generated tokenizer of `family` as a PreTrainedTokenizerFast (chat template and special
    tokens as in a written checkpoint), and the config.json token-id fields that go with it."""
    tok_config = tokenizer_config(family, max_length)
    tokenizer = fast_tokenizer(
        tok_config, tok_config["chat_template"], tokenizer_object=build_tokenizer(SPECIAL_TOKENS[family])
    )
    fields = config_token_ids(family)
    if family == "llada":
        fields["bos_token_id"] = special_ids(family)["<|startoftext|>"]
    return tokenizer, fields


def build_tokenizer(specials: list[str]) -> Tokenizer:
    """Byte-level BPE: special tokens first (small ids), then the 256 byte
    symbols, then one merge chain per word in WORDS. Built, not trained, so it
    is the same every time."""
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = []

    def merge(a, b):
        if a + b not in vocab:
            merges.append((a, b))
            vocab[a + b] = len(vocab)

    for word in WORDS:
        for i in range(1, len(word)):  # left-to-right chain: t+h, th+e
            merge(word[:i], word[i])
        merge("\u0120", word)  # then " the" (byte-level shows " " as Ġ) as one token
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok
