"""Collators, packing, the LongBench reader and the offline text sources."""

import json
from pathlib import Path

import pytest
import torch

from transformers_longspec.trainers import (
    ChatCollator,
    TextCollator,
    TokenCollator,
    longbench_to_messages,
    pack_texts,
    python_package_sources,
    read_longbench_jsonl,
    self_distill_texts,
    source_snippet_prompts,
)
from transformers_longspec.trainers.exclusions import evaluation_reason

from tiny_models import make_target
from trainer_helpers import make_char_tokenizer


def test_pack_texts_exact_blocks(char_tokenizer):
    blocks = pack_texts(["abc", "de", "fghij"], char_tokenizer, seq_length=4)
    eos = char_tokenizer.eos_token_id
    stream = [*char_tokenizer("abc")["input_ids"], eos, *char_tokenizer("de")["input_ids"], eos,
              *char_tokenizer("fghij")["input_ids"], eos]  # 12 tokens -> 3 blocks
    assert [b["input_ids"].tolist() for b in blocks] == [stream[0:4], stream[4:8], stream[8:12]]
    assert len(pack_texts(["abc", "de", "fghij"], char_tokenizer, 4, max_sequences=2)) == 2
    assert len(pack_texts(("x" * 9 for _ in range(10)), char_tokenizer, 5, batch_size=3)) == 20
    with pytest.raises(ValueError, match="seq_length"):
        pack_texts(["a"], char_tokenizer, 1)


def test_token_collator_pads_right_and_masks_labels():
    batch = TokenCollator(pad_token_id=2)([{"input_ids": [5, 6, 2]}, {"input_ids": [7], "labels": [-100]}])
    assert batch["input_ids"].tolist() == [[5, 6, 2], [7, 2, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 2], [-100, -100, -100]]  # a real EOS (= pad id) keeps its label
    padded = TokenCollator(0, max_length=2, pad_to_multiple_of=4)([{"input_ids": torch.tensor([5, 6, 7])}])
    assert padded["input_ids"].tolist() == [[5, 6, 0, 0]] and padded["labels"].tolist() == [[5, 6, -100, -100]]
    with pytest.raises(ValueError, match="same length"):
        TokenCollator(0)([{"input_ids": [1, 2], "labels": [1]}])


def test_text_collator_truncates_and_appends_eos(char_tokenizer):
    batch = TextCollator(char_tokenizer, max_length=5)([{"text": "abcdefgh"}, {"text": "ab"}])
    ab = char_tokenizer("ab")["input_ids"]
    assert batch["input_ids"][1].tolist() == ab + [char_tokenizer.eos_token_id, 0, 0]
    assert batch["input_ids"].shape == (2, 5) and batch["labels"][1, 3:].tolist() == [-100, -100]
    with pytest.raises(ValueError, match="'text' column"):
        TextCollator(char_tokenizer, 5)([{"content": "x"}])


def test_chat_collator_labels_assistant_turns_only(char_tokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "ok?"}, {"role": "assistant", "content": "sure"}]
    batch = ChatCollator(char_tokenizer, max_length=200)([{"messages": messages}])
    labelled = [t for t in batch["labels"][0].tolist() if t != -100]
    assert char_tokenizer.decode(labelled) == "yo</s>sure</s>"
    full = ChatCollator(char_tokenizer, max_length=200, assistant_only=False)([{"messages": messages}])
    assert torch.equal(full["labels"], full["input_ids"])
    tail = ChatCollator(char_tokenizer, max_length=5)([{"messages": messages}])  # keeps the LAST tokens
    assert char_tokenizer.decode(tail["input_ids"][0].tolist()) == "sure</s>"


def test_chat_collator_falls_back_when_prefixes_do_not_match():
    tok = make_char_tokenizer("{% for m in messages %}[{{ loop.length }}]{{ m['content'] }}{% endfor %}")
    with pytest.warns(UserWarning, match="labelling every token"):
        batch = ChatCollator(tok, 100)([{"messages": [{"role": "user", "content": "a"},
                                                      {"role": "assistant", "content": "b"}]}])
    assert torch.equal(batch["labels"], batch["input_ids"])
    with pytest.raises(ValueError, match="chat template"):
        ChatCollator(make_char_tokenizer(None), 10)([{"messages": []}])


def test_longbench_reader(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"_id": "a", "dataset": "x", "input": "Q?", "context": "C.", "answers": ["A"], "length": 3,
             "bucket": "2k"}]
    path.write_text("\n".join(json.dumps(r) for r in rows * 3) + "\n")
    got = read_longbench_jsonl(path, limit=2)
    assert len(got) == 2 and got[0]["_id"] == "a"
    chat = longbench_to_messages(got[0])["messages"]
    assert chat == [{"role": "user", "content": "C.\n\nQ?"}, {"role": "assistant", "content": "A"}]
    path.write_text(json.dumps({"input": "Q"}) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl:1.*\['context', 'answers'\]"):
        read_longbench_jsonl(path)


def test_package_sources_refuse_evaluation_material():
    with pytest.raises(ValueError, match="standard library"):
        next(python_package_sources(["json"]))
    with pytest.raises(ValueError, match="llama.cpp"):
        next(python_package_sources(["gguf"]))
    with pytest.raises(ValueError, match="not installed"):
        next(python_package_sources(["no_such_package_xyz"]))
    assert evaluation_reason(Path(json.__file__)) == "the CPython standard library"


def test_package_sources_yield_third_party_files():
    docs = list(python_package_sources(["tqdm"], min_chars=2000, max_documents=5))
    assert len(docs) == 5 and all(len(d) >= 2000 for d in docs)
    again = list(python_package_sources(["tqdm"], min_chars=2000, max_documents=5))
    assert docs == again  # deterministic shuffle
    assert all(len(d) <= 100 for d in python_package_sources(["tqdm"], max_chars=100, max_documents=3))
    prompts = source_snippet_prompts(docs, 4, max_chars=50, seed=1)
    assert len(prompts) == 4 and prompts == source_snippet_prompts(docs, 4, max_chars=50, seed=1)
    assert all("```python" in p for p in prompts)


def test_self_distill_texts(char_tokenizer):
    target = make_target("llama")
    chats = self_distill_texts(target, char_tokenizer, ["hi", "hello there"], max_new_tokens=4, batch_size=2)
    assert [c["messages"][0]["content"] for c in chats] == ["hi", "hello there"]
    assert all(c["messages"][1]["role"] == "assistant" for c in chats)
    plain = self_distill_texts(target, make_char_tokenizer(None), ["ab"], max_new_tokens=3)
    assert plain[0]["text"].startswith("ab")
