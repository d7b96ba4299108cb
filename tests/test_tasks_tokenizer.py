"""The task tokenizer: exact round trips, digit tokens, LLaDA chat format."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from caidllm.tasks import DRILL_NAMES, SPLITS, TASK_NAMES, get_task, get_training_task
from caidllm.tasks.base import count_tokens
from caidllm.tasks.vocab import SPECIAL_TOKENS, build_tokenizer, length_stats


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    ids = build_tokenizer(out, n_per_task=500)
    return out, ids, Tokenizer.from_file(str(out / "tokenizer.json"))


def test_special_ids_and_config(built):
    out, ids, tok = built
    assert ids["eos_token_id"] == ids["pad_token_id"] == tok.token_to_id("<|endoftext|>")
    assert ids["bos_token_id"] == tok.token_to_id("<|startoftext|>")
    assert ids["mask_token_id"] == tok.token_to_id("<|mdm_mask|>")
    assert len({tok.token_to_id(t) for t in SPECIAL_TOKENS}) == len(SPECIAL_TOKENS)
    assert 300 <= ids["vocab_size"] <= 2000
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is False
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["bos_token"] == "<|startoftext|>" and config["eos_token"] == "<|endoftext|>"


def test_round_trip_task_texts(built):
    _, _, tok = built
    for name in TASK_NAMES:
        for split in SPLITS:
            for ex in get_task(name).examples(split, 100, seed=5):
                for text in (ex.prompt, ex.answer, ex.prompt + "\n" + ex.answer):
                    ids = tok.encode(text).ids
                    assert tok.decode(ids) == text
                    assert len(ids) == count_tokens(text)  # the length cap counts right


def test_drills_need_no_new_vocabulary(built):
    """The drills are not in the tokenizer's corpus, so that adding one to the
    recipe leaves the vocabulary of a fresh run unchanged; every piece of
    their text must already be a single token."""
    _, _, tok = built
    for name in DRILL_NAMES:
        for ex in get_training_task(name).examples("train", 100, seed=5):
            for text in (ex.prompt, ex.answer):
                ids = tok.encode(text).ids
                assert tok.decode(ids) == text and len(ids) == count_tokens(text)


def test_any_text_round_trips(built):
    _, _, tok = built
    for text in ("Héllo wörld 🙂", "tab\there  two  spaces\r\nx", "  lead", "unseenword42!"):
        assert tok.decode(tok.encode(text).ids) == text


def test_digits_words_and_symbols_are_single_tokens(built):
    _, _, tok = built
    enc = tok.encode("((-1 + 2 + 9 * 50) - (-2 + -4 * -7)) = 1234567890")
    digits = [t for t in enc.tokens if any(c.isdigit() for c in t)]
    assert digits and all(len(t) == 1 for t in digits)
    assert len(tok.encode("- Sherrie tells the truth.").ids) == 6  # "-", four words and "."
    assert len(tok.encode(" Shaunda says").ids) == 2
    for s in (" (", " )", " [", " ]", " {", " }", " <", " >", " +", " *", " -", "\n"):
        assert len(tok.encode(s).ids) == 1, s


def test_answers_fit_the_canvas(built):
    out, _, _ = built
    stats = length_stats(out / "tokenizer.json", n_per_task=200)
    for name, s in stats.items():
        assert s["answer_max"] <= 180, (name, s)


def test_transformers_chat_template(built):
    transformers = pytest.importorskip("transformers")
    out, ids, _ = built
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    fast.chat_template = auto.chat_template
    fast.bos_token = "<|startoftext|>"
    prompt = "not ( True ) and ( True ) is"
    for t in (auto, fast):
        text = t.apply_chat_template(
            [{"role": "user", "content": " " + prompt + "\n"}], add_generation_prompt=True, tokenize=False
        )
        assert text == (
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n"
            + prompt
            + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    ids_list = auto(text, add_special_tokens=False)["input_ids"]
    assert ids_list[0] == ids["bos_token_id"] and ids_list[1] == ids["start_header_id"]
    assert ids["eot_id"] in ids_list and ids_list.count(ids["end_header_id"]) == 2
    assert auto.decode(ids_list) == text
    answer = get_task("dyck_languages").example(0).answer
    assert auto.decode(auto(answer, add_special_tokens=False)["input_ids"]) == answer


def test_caidllm_train_builds_the_shipped_tokenizer(tmp_path):
    # training/ keeps no tokenizer of its own: a run folder's tokenizer/ is rebuilt by
    # `caidllm train`, and must be byte for byte the one the package ships.
    from importlib.resources import files

    build_tokenizer(tmp_path)
    shipped = files("caidllm") / "assets" / "tiny"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes()
