"""The build's fixed costs: a generic tokenizer is read without transformers (and torch), with the same identity.

Why: ``import transformers`` imports torch and costs seconds per build (and
per task of a multi-task build) before a token is encoded; a store's
fingerprint includes the tokenizer's identity, so the fast path must give
exactly the identity the transformers path gives.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from conformance.impl_tests.test_store import word_tokenizer
from impl import encoding


@pytest.fixture(scope="module")
def word_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "word"
    word_tokenizer().save_pretrained(str(path))
    bare = path.parent / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((path / "tokenizer.json").read_bytes())
    return path


def _specs(word_dir):
    return {"directory": word_dir, "tokenizer.json beside its config": word_dir / "tokenizer.json",
            "bare tokenizer.json": word_dir.parent / "bare" / "tokenizer.json",
            "tokenizers.Tokenizer": Tokenizer.from_file(str(word_dir / "tokenizer.json"))}


@pytest.mark.parametrize("kind", ["directory", "tokenizer.json beside its config", "bare tokenizer.json",
                                  "tokenizers.Tokenizer"])
def test_a_generic_tokenizer_read_directly_has_the_identity_transformers_gives_it(word_dir, monkeypatch, kind):
    spec = _specs(word_dir)[kind]
    direct = encoding.resolve_tokenizer(spec)
    assert encoding._direct_json_and_config(spec) is not None
    monkeypatch.setattr(encoding, "_direct_json_and_config", lambda spec: None)
    assert encoding.resolve_tokenizer(spec) == direct


def test_a_model_tokenizer_that_transformers_rebuilds_still_goes_through_transformers():
    from fixtures.generators import tokenizer_path

    assert encoding._direct_json_and_config(tokenizer_path()) is None


def test_resolving_a_generic_tokenizer_directory_imports_neither_transformers_nor_torch(word_dir):
    code = ("import sys; from impl.encoding import resolve_tokenizer; "
            f"info = resolve_tokenizer({str(word_dir)!r})[1]; "
            "print(info.eos_id, 'transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["3", "False", "False"]


def test_a_model_tokenizer_resolved_once_is_read_back_without_transformers_with_the_same_identity(tmp_path,
                                                                                                 monkeypatch):
    from fixtures.generators import tokenizer_path

    monkeypatch.setenv("LOADSPEC_TOKENIZER_CACHE", "off")
    uncached = encoding.resolve_tokenizer(tokenizer_path())
    monkeypatch.setenv("LOADSPEC_TOKENIZER_CACHE", str(tmp_path / "cache"))
    assert encoding.resolve_tokenizer(tokenizer_path()) == uncached
    code = ("import sys; from impl.encoding import resolve_tokenizer; "
            f"tok_json, info = resolve_tokenizer({str(tokenizer_path())!r}); "
            "print(info.sha256, info.class_name, 'transformers' in sys.modules, 'torch' in sys.modules)")
    env = {**__import__("os").environ, "LOADSPEC_TOKENIZER_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env=env)
    assert out.stdout.split() == [uncached[1].sha256, uncached[1].class_name, "False", "False"]


def test_a_changed_tokenizer_file_is_not_answered_from_the_cache(tmp_path, monkeypatch):
    import shutil

    from fixtures.generators import tokenizer_path

    monkeypatch.setenv("LOADSPEC_TOKENIZER_CACHE", str(tmp_path / "cache"))
    tok = tmp_path / "gpt2"
    shutil.copytree(tokenizer_path(), tok)
    assert encoding.resolve_tokenizer(tok)[1].eos_token == "<|endoftext|>"
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config = tok / name
        config.write_text(config.read_text().replace('"eos_token": "<|endoftext|>"', '"eos_token": "!"'))
    info = encoding.resolve_tokenizer(tok)[1]
    assert (info.eos_token, info.eos_id) == ("!", 0)


def test_a_one_file_build_with_num_proc_2_encodes_in_both_workers_and_equals_num_proc_1(word_dir, tmp_path,
                                                                                       monkeypatch):
    import os

    from conformance.impl_tests.test_store import expected_tokens, make_docs, token_files, word_tokenizer
    from impl import build_pool
    from impl.store import TokenStore

    pieces: list[tuple[int, int, int]] = []
    monkeypatch.setattr(build_pool, "_on_piece_encoded", lambda pid, f, n: pieces.append((pid, f, n)),
                        raising=False)
    texts = make_docs(60, seed=11)
    one = TokenStore.build(texts, word_dir, tmp_path / "one", num_proc=1, batch_size=10, progress=False)
    two = TokenStore.build(texts, word_dir, tmp_path / "two", num_proc=2, batch_size=10, progress=False)
    assert one.num_files == two.num_files == 1
    assert [p.read_bytes() for p in token_files(one)] == [p.read_bytes() for p in token_files(two)]
    assert one.meta["files"] == two.meta["files"]  # sizes, sha256, block and document CRCs
    assert one.fingerprint == two.fingerprint
    assert [two[i].tolist() for i in range(len(two))] == expected_tokens(word_tokenizer(), texts)
    workers = {pid for pid, _, _ in pieces}
    assert len(workers) == 2 and os.getpid() not in workers, pieces
    assert [f for _, f, _ in pieces] == [0] * len(pieces) and sum(n for _, _, n in pieces) == len(texts)
