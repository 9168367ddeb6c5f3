"""The catalogue of bad dataset inputs: each is refused with a typed error whose message names the problem and the fix.

One case per bad input (issue 8, dataset side): a store that already adds
EOS/BOS with ``add_eos``/``add_bos`` again, stores whose epochs hold no
sample or no trainable label, integers out of range or of the wrong type,
unknown names, a missing store. Plus one input that is refused silently by
design: a corrupted plan cache file is recomputed, never trusted.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from conformance.assertions import assert_equal, assert_raises_typed, check
from conformance.impl_tests.test_dataset import make_store
from conformance.impl_tests.test_store import word_tokenizer
from impl.dataset import MAX_SEQ_LEN, PackedDataset
from impl.errors import ConfigError, EmptyDataError, StoreCorruptError, StoreNotFoundError
from impl.store import TokenStore

CORPUS = [[[11, 12, 13], [14, 15, 16, 17, 18, 19]], [[20, 21], [22, 23, 24, 25, 26, 27, 28, 29, 30, 31]]]


@pytest.fixture(scope="module")
def stores():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = word_tokenizer()
        texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota"]
        yield {
            "plain": make_store(CORPUS, root / "plain"),
            "with_eos": TokenStore.build(texts, tok, root / "with-eos", num_proc=1, progress=False),
            "with_bos": TokenStore.build(texts, tok, root / "with-bos", num_proc=1, add_bos=True, add_eos=False,
                                         progress=False),
            "empty_docs": make_store([[[], []], [[]]], root / "empty-docs", vocab_size=10, bos_id=None, eos_id=None,
                                     pad_id=None),
            "single_tokens": make_store([[[5], [6]], [[7]]], root / "single", vocab_size=10, bos_id=None, eos_id=None,
                                        pad_id=None),
            "missing": root / "no-such-store",
        }


# (store, kwargs, error, [the problem, the fix])
CASES = {
    "double EOS": ("with_eos", {"seq_len": 4, "add_eos": True}, ConfigError,
                   ["add_eos=True", "built with add_eos=True", "doubled", "set add_eos=False"]),
    "double BOS": ("with_bos", {"seq_len": 4, "add_bos": True}, ConfigError,
                   ["add_bos=True", "built with add_bos=True", "doubled", "set add_bos=False"]),
    "all documents empty": ("empty_docs", {"seq_len": 4, "packing": "none"}, EmptyDataError,
                            ["keeps no document", "every document is empty", "add_eos=True"]),
    "no trainable label": ("single_tokens", {"seq_len": 2, "packing": "none"}, EmptyDataError,
                           ["no trainable label", "-100", "add_eos=True"]),
    "no trainable label (concat)": ("single_tokens", {"seq_len": 2}, EmptyDataError,
                                    ["no trainable label", "3 kept documents", "set add_eos=True"]),
    "too few tokens for one sample": ("plain", {"seq_len": 2048}, EmptyDataError,
                                      ["yields 21 tokens", "seq_len=2048", "lower seq_len"]),
    "seq_len 2**31": ("plain", {"seq_len": 2**31}, ConfigError, ["seq_len=2147483648", f"[1, {MAX_SEQ_LEN}]"]),
    "seq_len 0": ("plain", {"seq_len": 0}, ConfigError, ["seq_len=0", "e.g. seq_len=2048"]),
    "seq_len -1": ("plain", {"seq_len": -1}, ConfigError, ["seq_len=-1", "e.g. seq_len=2048"]),
    "seq_len bool": ("plain", {"seq_len": True}, ConfigError, ["seq_len=True", "must be an integer"]),
    "seq_len float": ("plain", {"seq_len": 2048.0}, ConfigError, ["seq_len=2048.0", "must be an integer"]),
    "seq_len string": ("plain", {"seq_len": "2048"}, ConfigError, ["seq_len='2048'", "must be an integer"]),
    "seed negative": ("plain", {"seq_len": 4, "seed": -1}, ConfigError, ["seed=-1", "below 2**64"]),
    "seed 2**64": ("plain", {"seq_len": 4, "seed": 2**64}, ConfigError, ["seed=18446744073709551616", "below 2**64"]),
    "seed float": ("plain", {"seq_len": 4, "seed": 1.5}, ConfigError, ["seed=1.5", "must be an integer"]),
    "stride = seq_len": ("plain", {"seq_len": 4, "packing": "none", "stride": 4}, ConfigError,
                         ["stride=4", "lower stride"]),
    "stride huge": ("plain", {"seq_len": 4, "packing": "none", "stride": 2**40}, ConfigError,
                    [f"stride={2**40}", "below seq_len"]),
    "window 0": ("plain", {"seq_len": 4, "shuffle": "window", "window": 0}, ConfigError,
                 ["window=0", "documents per shuffle window"]),
    "pack_window 0": ("plain", {"seq_len": 4, "packing": "greedy", "pack_window": 0}, ConfigError,
                      ["pack_window=0", "e.g. pack_window=1000"]),
    "min_len negative": ("plain", {"seq_len": 4, "min_len": -1}, ConfigError, ["min_len=-1", "0 keeps every"]),
    "pad_id negative": ("plain", {"seq_len": 4, "pad_id": -1}, ConfigError, ["pad_id=-1", "a token id"]),
    "epoch negative": ("plain", {"seq_len": 4, "epoch": -1}, ConfigError, ["epoch=-1", "e.g. epoch=0"]),
    "unknown packing": ("plain", {"seq_len": 4, "packing": "pack"}, ConfigError, ["packing='pack'", "best_fit"]),
    "unknown shuffle": ("plain", {"seq_len": 4, "shuffle": "random"}, ConfigError,
                        ["shuffle='random'", "choose one of none, global, window"]),
    "buffer shuffle": ("plain", {"seq_len": 4, "shuffle": "buffer"}, NotImplementedError,
                       ["shuffle='buffer'", "global", "window"]),
    "store path missing": ("missing", {"seq_len": 4}, StoreNotFoundError,
                           ["does not exist", "TokenStore.build"]),
}


@pytest.mark.clause("PACK-21", "PACK-2")
@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_dataset_input_is_refused_with_a_typed_error_naming_the_problem_and_the_fix(stores, case):
    store, kwargs, error, mentions = CASES[case]
    assert_raises_typed(error, PackedDataset, stores[store], clause="PACK-21", what=case, mentions=mentions,
                        cache_dir=False, **kwargs)


@pytest.mark.clause("PACK-20")
def test_the_bounds_accept_their_edges(stores):
    ds = PackedDataset(stores["plain"], seq_len=4, packing="none", stride=2, seed=2**64 - 1, pad_id=0, cache_dir=False)
    assert_equal(ds.config.ordering.seed, 2**64 - 1, clause="PACK-21", what="the largest seed")


@pytest.mark.clause("PACK-20")
def test_a_corrupted_plan_cache_file_is_recomputed_not_trusted(stores, tmp_path):
    store = stores["plain"]
    kwargs = {"seq_len": 3, "packing": "greedy", "shuffle": "global", "seed": 5}
    expected = PackedDataset(store, cache_dir=False, **kwargs).samples(0, range(4))
    first = PackedDataset(store, cache_dir=tmp_path, **kwargs)
    first.plan(0)
    npy, _ = first.plan_paths(0)
    data = bytearray(npy.read_bytes())
    data[-5] ^= 0x40                                    # a value of the last block
    npy.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = PackedDataset(store, cache_dir=tmp_path, **kwargs).samples(0, range(4))
    for name in expected:
        check(np.array_equal(got[name], expected[name]), clause="PACK-20", what=f"{name} after a corrupt cache")
    check(any("corrupt" in str(w.message) and npy.name in str(w.message) for w in caught), clause="PACK-20",
          what=f"a warning names the corrupt cache file: {[str(w.message) for w in caught]}")


@pytest.mark.clause("PACK-20")
def test_a_meta_json_whose_counts_disagree_with_the_lengths_is_refused_at_the_first_plan(tmp_path):
    store = make_store([[[1, 2, 3], []], [[4, 5, 6, 7]]], tmp_path / "store")
    meta = json.loads((store.path / "meta.json").read_text())
    meta["num_empty_documents"] = 0                      # claims every document holds tokens
    (store.path / "meta.json").write_text(json.dumps(meta))
    ds = PackedDataset(TokenStore.open(store.path), seq_len=2, packing="none", overflow="truncate", cache_dir=False)
    assert_raises_typed(StoreCorruptError, ds.plan, 0, clause="PACK-20", what="meta.json counts against the lengths",
                        mentions=["meta.json", "3 samples", "2", "rebuild"])
