"""Tokenizer for the task texts, in the LLaDA-8B-Instruct file layout.

Design (short sequences, learnable digits, exact round trip):
  * text is first cut into pieces: a word with its leading space
    (" truth"), one punctuation mark with its leading space (" (", "."),
    one digit ("2", so numbers are spelled digit by digit), a newline, or a
    run of other whitespace;
  * pieces are then mapped to bytes shown as printable characters
    (byte-level), so any string at all can be encoded and decoded back;
  * the model is a Unigram whose vocabulary is the 256 byte characters plus
    every piece seen in the task texts, the latter scored far higher: a
    known word is one token, an unknown one falls back to its characters.

Run ``python -m caidllm.tasks.vocab OUT_DIR`` to build and print token
length statistics per task.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from caidllm.errors import InputError
from caidllm.tasks.base import PIECE_PATTERN

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"  # also the pad token
MASK = "<|mdm_mask|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS = (EOS, BOS, MASK, START_HEADER, END_HEADER, EOT)  # ids 0..5


# LLaDA chat format: BOS, then per message a role header, the stripped
# content and <|eot_id|>; the generation prompt opens an assistant header.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + (message['content'] | trim) + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
# Words that appear in chat-formatted text but not in the task texts.
EXTRA_WORDS = ("user", "assistant", "system")
_WORD_SCORE = -1.0  # any known piece beats splitting (byte chars score -10)
_CHAR_SCORE = -10.0


def _byte_level() -> pre_tokenizers.ByteLevel:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            _byte_level(),
        ]
    )


def _to_bytes_chars(piece: str) -> str:
    """The byte-level spelling of a piece (" True" -> "ĠTrue")."""
    return "".join(p for p, _ in _byte_level().pre_tokenize_str(piece))


def task_pieces(n_per_task: int = 2000, seed: int = 0, tasks: tuple[str, ...] | None = None) -> list[str]:
    """Every multi-character piece of the task texts and word pools (of `tasks`:
    by default the benchmark families and the chat words, `tiny`'s vocabulary)."""
    from caidllm.tasks import TASK_NAMES, corpus_texts, get_task

    counts: Counter[str] = Counter()
    for text in corpus_texts(n_per_task, seed, tasks or TASK_NAMES):
        counts.update(re.findall(PIECE_PATTERN, text))
    for name in tasks or TASK_NAMES:
        for word in get_task(name).words:
            counts.update([word, " " + word])
    for word in EXTRA_WORDS if tasks is None else ():
        counts.update([word, " " + word])
    return sorted(p for p in counts if len(p) > 1 and not p.isspace())


def _cot_tasks() -> tuple[str, ...]:
    from caidllm.tasks import COT_NAMES

    return COT_NAMES


# Pieces added after tiny's, per vocabulary: (the tasks they come from, examples read per
# task). Appended at the end, so every token of `tiny` keeps its id and a run can start
# from its weights (train/init_weights.py gives the new rows their first values).
VOCABULARIES = {"tiny": (tuple, 0), "tiny-cot": (_cot_tasks, 500)}


def vocabulary_extra(name: str) -> tuple[tuple[str, ...], int]:
    if name not in VOCABULARIES:
        raise InputError(f"vocabulary must be one of {', '.join(VOCABULARIES)}, got {name!r}")
    tasks, n = VOCABULARIES[name]
    return tasks(), n


def _unigram_vocab(n_per_task: int, seed: int, vocabulary: str) -> list[tuple[str, float]]:
    """Special tokens, the 256 byte characters, tiny's pieces, then the vocabulary's own."""
    extra_tasks, extra_n = vocabulary_extra(vocabulary)
    vocab = [(tok, 0.0) for tok in SPECIAL_TOKENS]
    vocab += [(ch, _CHAR_SCORE) for ch in sorted(pre_tokenizers.ByteLevel.alphabet())]
    seen = {tok for tok, _ in vocab}
    pieces = task_pieces(n_per_task, seed)
    if extra_tasks:
        pieces += task_pieces(extra_n, seed, extra_tasks)
    for piece in pieces:
        spelled = _to_bytes_chars(piece)
        if spelled not in seen:
            seen.add(spelled)
            vocab.append((spelled, _WORD_SCORE))
    return vocab


def build_tokenizer(
    out_dir: str | Path, n_per_task: int = 2000, seed: int = 0, vocabulary: str = "tiny"
) -> dict[str, int]:
    """Write tokenizer.json and tokenizer_config.json to ``out_dir``;
    return the special token ids."""
    if n_per_task < 1:
        raise InputError(f"n_per_task must be >= 1, got {n_per_task!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = _unigram_vocab(n_per_task, seed, vocabulary)
    tok = Tokenizer(models.Unigram(vocab, unk_id=None, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(out / "tokenizer.json"))

    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "mask_token": MASK,
        "chat_template": CHAT_TEMPLATE,
        # Must stay off: the clean-up rewrites " ." and would break round trips.
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return {
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[EOS],
        "mask_token_id": ids[MASK],
        "start_header_id": ids[START_HEADER],
        "end_header_id": ids[END_HEADER],
        "eot_id": ids[EOT],
        "vocab_size": tok.get_vocab_size(),
    }


def length_stats(tokenizer_file: str | Path, n_per_task: int = 500, split: str = "test") -> dict:
    """Prompt and answer token counts per task: {task: {prompt_max, ...}}."""
    from caidllm.tasks import TASK_NAMES, get_task

    tok = Tokenizer.from_file(str(tokenizer_file))
    stats = {}
    for name in TASK_NAMES:
        exs = get_task(name).examples(split, n_per_task)
        p = [len(tok.encode(e.prompt).ids) for e in exs]
        a = [len(tok.encode(e.answer).ids) for e in exs]
        stats[name] = {
            "prompt_max": max(p),
            "prompt_mean": round(statistics.mean(p), 1),
            "answer_max": max(a),
            "answer_mean": round(statistics.mean(a), 1),
        }
    return stats


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m caidllm.tasks.vocab OUT_DIR")
    ids = build_tokenizer(args[0])
    print(json.dumps(ids))
    for name, s in length_stats(Path(args[0]) / "tokenizer.json").items():
        print(f"{name:26s} {s}")


if __name__ == "__main__":
    main()
