"""The eager Hugging Face path: KempnerForge's chunk samples, tokenized once, cached, resumable, EOS explicit.

The oracle is KempnerForge's recipe written out here: encode each text
without special tokens, append EOS, concatenate, cut disjoint windows of
``seq_len + 1`` tokens, inputs ``w[:-1]``, labels ``w[1:]`` with -100 where
the target belongs to another document. Everything runs offline: datasets
come from ``Dataset.from_dict`` or a local JSON Lines file, the tokenizer is
the repository's GPT-2 fixture or a tiny in-memory one.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from conformance.assertions import assert_equal, assert_raises_typed
from impl import build as build_module
from impl.errors import ConfigError, EmptyDataError, TokenizerError
from impl.hf import HuggingFaceDataset
from impl.loader import build_dataloader

GPT2 = Path(__file__).resolve().parents[2] / "fixtures" / "tokenizer" / "gpt2"
TEXTS = [
    "In the beginning was the loader.",
    "",
    "Short.",
    "A rather longer document that spans more than one window of tokens, so that chunks cut it in the middle.",
    "Another one, with punctuation; and numbers 1 2 3.",
    "The end of the split.",
] * 3


@pytest.fixture(scope="module")
def gpt2():
    return AutoTokenizer.from_pretrained(str(GPT2), local_files_only=True)


def _oracle(texts, tok, seq_len):
    stream, owner = [], []
    for d, text in enumerate(texts):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        stream += ids
        owner += [d] * len(ids)
    out = []
    for start in range(0, len(stream) - seq_len, seq_len + 1):
        w, o = stream[start:start + seq_len + 1], owner[start:start + seq_len + 1]
        labels = [w[j + 1] if o[j + 1] == o[j] else -100 for j in range(seq_len)]
        out.append({"input_ids": w[:-1], "labels": labels, "doc_ids": o[:-1]})
    return out


@pytest.mark.clause("PACK-4", "PACK-8")
def test_samples_are_kempnerforge_chunks_with_doc_ids_and_labels_masked_across_documents(tmp_path, gpt2):
    ds = HuggingFaceDataset(datasets.Dataset.from_dict({"text": TEXTS}), gpt2, seq_len=16, cache_dir=tmp_path)
    expected = _oracle(TEXTS, gpt2, 16)
    assert_equal(len(ds), len(expected), clause="PACK-8", what="number of chunks")
    for i, want in enumerate(expected):
        got = ds[i]
        for field in ("input_ids", "labels", "doc_ids"):
            assert_equal(got[field].tolist(), want[field], clause="PACK-4", what=f"sample {i} {field}")


def test_a_restart_reuses_the_cached_tokens_without_tokenizing_or_reading_rows(tmp_path, gpt2, monkeypatch):
    split = datasets.Dataset.from_dict({"text": TEXTS})
    first = HuggingFaceDataset(split, gpt2, seq_len=16, cache_dir=tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("the cached split was tokenized or read again")

    monkeypatch.setattr(build_module, "_tokenize_into", refuse)
    monkeypatch.setattr(datasets.Dataset, "select_columns", refuse)
    again = HuggingFaceDataset(datasets.Dataset.from_dict({"text": TEXTS}), gpt2, seq_len=16, cache_dir=tmp_path)
    assert again.store.path == first.store.path
    assert again[3]["input_ids"].tolist() == first[3]["input_ids"].tolist()
    monkeypatch.undo()
    other = HuggingFaceDataset(datasets.Dataset.from_dict({"text": TEXTS[:-1]}), gpt2, seq_len=16, cache_dir=tmp_path)
    assert other.store.path != first.store.path, "other data must get its own store"


def test_a_local_json_lines_split_loads_through_load_dataset_offline(tmp_path, gpt2):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS))
    ds = HuggingFaceDataset("json", gpt2, split="train", seq_len=8, text_field="body", cache_dir=tmp_path / "cache",
                            load_kwargs={"data_files": str(path), "cache_dir": str(tmp_path / "hf")})
    assert_equal([ds[i]["input_ids"].tolist() for i in range(len(ds))],
                 [s["input_ids"] for s in _oracle(TEXTS, gpt2, 8)], clause="PACK-8", what="chunks of the json split")


@pytest.mark.clause("RES-1")
def test_loading_resumes_exactly_from_a_json_state(tmp_path, gpt2):
    ds = HuggingFaceDataset(datasets.Dataset.from_dict({"text": TEXTS}), gpt2, seq_len=8, cache_dir=tmp_path,
                            shuffle="global", seed=3)
    full = [b["sample_index"].tolist() for b in build_dataloader(ds, batch_size=2)]
    loader = build_dataloader(ds, batch_size=2)
    it = iter(loader)
    head = [next(it)["sample_index"].tolist() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = build_dataloader(ds, batch_size=2)
    resumed.load_state_dict(state)
    assert_equal(head + [b["sample_index"].tolist() for b in resumed], full, clause="RES-1", what="resumed stream")


def _word_tokenizer(eos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", "the", "end", "a", "b"])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", **({"eos_token": "</s>"} if eos else {}))


def test_a_tokenizer_without_eos_is_refused_unless_the_boundary_token_is_named(tmp_path):
    split = datasets.Dataset.from_dict({"text": ["the end", "a b a b", "the a"]})
    tok = _word_tokenizer(eos=False)
    assert_raises_typed(TokenizerError, HuggingFaceDataset, split, tok, seq_len=3, cache_dir=tmp_path,
                        clause="HF", what="no EOS", mentions=["no EOS", "eos_token="])
    assert_raises_typed(TokenizerError, HuggingFaceDataset, split, tok, seq_len=3, cache_dir=tmp_path,
                        eos_token="<|endoftext|>", clause="HF", what="unknown EOS", mentions=["<|endoftext|>"])
    ds = HuggingFaceDataset(split, tok, seq_len=3, cache_dir=tmp_path, eos_token="</s>")
    assert_equal(ds[0]["input_ids"].tolist(), [2, 3, 1], clause="HF", what="EOS appended")
    assert tok.eos_token is None, "the caller's tokenizer must not be modified"


def test_an_eos_token_missing_from_the_vocabulary_is_told_a_token_it_has_never_the_rejected_one(tmp_path):
    split = datasets.Dataset.from_dict({"text": ["the end", "a b a b", "the a"]})
    for tok, own in ((_word_tokenizer(eos=False), None), (_word_tokenizer(eos=True), "</s>")):
        with pytest.raises(TokenizerError) as info:
            HuggingFaceDataset(split, tok, seq_len=3, cache_dir=tmp_path, eos_token="<|endoftext|>")
        message = str(info.value)
        offered = message.split("name a token it has:", 1)[1]
        assert "'</s>'" in offered and "<|endoftext|>" not in offered, message
        assert (own is None) == ("eos_token=None" not in message), message


def test_bad_splits_are_refused_with_typed_errors(tmp_path, gpt2):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": TEXTS})})
    assert_raises_typed(ConfigError, HuggingFaceDataset, dd, gpt2, seq_len=8, cache_dir=tmp_path, clause="HF",
                        what="DatasetDict without split", mentions=["split=None", "train"])
    assert_raises_typed(EmptyDataError, HuggingFaceDataset, datasets.Dataset.from_dict({"text": ["tiny"]}), gpt2,
                        seq_len=64, cache_dir=tmp_path, clause="PACK-8", what="split shorter than one window",
                        mentions=["seq_len=64"])


def test_a_split_too_short_for_one_window_is_refused_offering_only_options_the_class_has(tmp_path, gpt2):
    error = assert_raises_typed(EmptyDataError, HuggingFaceDataset, datasets.Dataset.from_dict({"text": ["tiny"]}),
                                gpt2, seq_len=64, cache_dir=tmp_path, clause="PACK-8", what="split shorter than a window",
                                mentions=["seq_len=64", "at least 65", "lower seq_len", "longer split"])
    assert "packing" not in str(error), f"HuggingFaceDataset has no packing= option, yet: {error}"


def test_a_split_of_empty_texts_is_refused_naming_text_field_not_options_the_class_lacks(tmp_path, gpt2):
    error = assert_raises_typed(EmptyDataError, HuggingFaceDataset, datasets.Dataset.from_dict({"text": [""] * 20}),
                                gpt2, seq_len=4, cache_dir=tmp_path, clause="PACK-4", what="only empty texts",
                                mentions=["no trainable label", "text_field='text'"])
    for absent in ("add_eos", "add_bos", "packing"):
        assert absent not in str(error), f"HuggingFaceDataset has no {absent}= option, yet: {error}"


def test_a_cache_dir_that_is_a_file_is_refused_as_a_config_error_naming_it(tmp_path):
    split = datasets.Dataset.from_dict({"text": ["the end", "a b a b", "the a"]})
    afile = tmp_path / "cache"
    afile.write_text("not a directory")
    assert_raises_typed(ConfigError, HuggingFaceDataset, split, _word_tokenizer(eos=True), seq_len=3, cache_dir=afile,
                        clause="HF", what="cache_dir is a file", mentions=[repr(str(afile)), "is a file"])
    assert afile.read_text() == "not a directory", "the file must be left alone"
