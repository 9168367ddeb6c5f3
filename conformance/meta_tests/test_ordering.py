"""Meta tests: reference.ordering obeys ORD-1..ORD-13.

The oracles below are written from the clause text, independently of
reference.ordering: they rebuild the file-order stream, the windows and the
buffer with plain lists, using only reference.rng.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import ConfigError, StateError
from reference.ordering import (
    KINDS,
    OrderingConfig,
    adjacency_preservation,
    epoch_order,
    file_order,
    file_order_stream,
    mean_displacement,
    order_at,
    remaining_order,
)
from reference.rng import MASK64, FeistelPermutation, Stream, below, derive_key, subkey

ROOT = Path(__file__).resolve().parents[2]

file_sizes = st.lists(st.integers(0, 12), max_size=8)
seeds = st.integers(0, MASK64)
epochs = st.integers(0, 10_000)


@st.composite
def configs(draw, kinds=KINDS):
    return OrderingConfig(kind=draw(st.sampled_from(kinds)), seed=draw(seeds),
                          window=draw(st.integers(1, 20)), buffer_size=draw(st.integers(0, 20)))


def oracle_stream(sizes, seed, epoch):
    """ORD-4 from the text: documents numbered file by file, files read in the keyed file order."""
    docs_of_file, next_id = [], 0
    for size in sizes:
        docs_of_file.append(list(range(next_id, next_id + size)))
        next_id += size
    files = FeistelPermutation(len(sizes), derive_key(seed, epoch, Stream.FILE_ORDER))
    return [doc for j in range(len(sizes)) for doc in docs_of_file[files(j)]]


def oracle_window(stream, w, seed, epoch):
    """ORD-5 from the text: cut into windows of w, permute each with its sub-key."""
    key = derive_key(seed, epoch, Stream.WINDOW)
    out = []
    for k, start in enumerate(range(0, len(stream), w)):
        window = stream[start:start + w]
        perm = FeistelPermutation(len(window), subkey(key, k))
        out.extend(window[perm(j)] for j in range(len(window)))
    return out


def oracle_buffer(stream, b, seed, epoch):
    """ORD-6 and ORD-7 from the text: the straightforward loop over a list buffer."""
    if b <= 1:
        return list(stream)
    key = derive_key(seed, epoch, Stream.BUFFER)
    buffer, out, t = [], [], 0
    for item in stream:
        if len(buffer) < b:
            buffer.append(item)
            continue
        slot = below(key, t, b)
        t += 1
        out.append(buffer[slot])
        buffer[slot] = item
    flush = FeistelPermutation(len(buffer), subkey(key, 0))
    out.extend(buffer[flush(i)] for i in range(len(buffer)))
    return out


def repro(sizes, config, epoch, **extra):
    return {"file_sizes": sizes, "config": config, "epoch": epoch, **extra}


@pytest.mark.clause("ORD-1")
@given(sizes=file_sizes, config=configs(), epoch=epochs)
def test_every_kind_orders_each_document_exactly_once(sizes, config, epoch):
    order = epoch_order(sizes, config, epoch)
    assert_exactly_once(order, range(sum(sizes)), clause="ORD-1", what="epoch order", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-1")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sizes", [[], [0], [0, 0, 0], [1], [0, 1, 0], [0, 0, 5, 0, 2]])
def test_every_kind_handles_no_documents_one_document_and_empty_files(kind, sizes):
    config = OrderingConfig(kind=kind, window=2, buffer_size=3)
    order = epoch_order(sizes, config, 4)
    assert_exactly_once(order, range(sum(sizes)), clause="ORD-1", what="epoch order", repro=repro(sizes, config, 4))
    assert_equal(len(order), sum(sizes), clause="ORD-1", what="length of the order", repro=repro(sizes, config, 4))


@pytest.mark.clause("ORD-2")
@given(sizes=file_sizes, seed=seeds, epoch=epochs)
def test_sequential_order_is_store_order_whatever_the_seed_and_epoch(sizes, seed, epoch):
    config = OrderingConfig(kind="sequential", seed=seed)
    assert_equal(epoch_order(sizes, config, epoch), list(range(sum(sizes))), clause="ORD-2",
                 what="sequential order", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-3")
def test_global_order_of_ten_documents_is_pinned_for_seed_zero_epoch_zero():
    assert_equal(epoch_order([10], OrderingConfig(kind="global"), 0), [4, 3, 8, 9, 7, 0, 1, 6, 2, 5],
                 clause="ORD-3", what="golden global order (N=10, seed=0, epoch=0)")


@pytest.mark.clause("ORD-3")
@given(seed=seeds, epoch=epochs, n=st.integers(0, 60), cut=st.integers(0, 60))
def test_global_order_is_the_feistel_permutation_whatever_the_file_boundaries(seed, epoch, n, cut):
    cut = min(cut, n)
    config = OrderingConfig(kind="global", seed=seed)
    perm = FeistelPermutation(n, derive_key(seed, epoch, Stream.ORDER))
    expected = [perm(p) for p in range(n)]
    for sizes in ([n], [cut, n - cut], [0, cut, 0, n - cut]):
        assert_equal(epoch_order(sizes, config, epoch), expected, clause="ORD-3", what="global order",
                     repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-4")
def test_file_order_stream_of_a_small_corpus_matches_the_hand_computed_one():
    config = OrderingConfig(kind="window")
    assert_equal(file_order([2, 3, 1], config, 0), [1, 0, 2], clause="ORD-4", what="file order of [2, 3, 1]")
    assert_equal(file_order_stream([2, 3, 1], config, 0), [2, 3, 4, 0, 1, 5], clause="ORD-4", what="stream S of [2, 3, 1]")


@pytest.mark.clause("ORD-4")
@given(sizes=file_sizes, seed=seeds, epoch=epochs)
def test_file_order_stream_reads_whole_files_in_the_keyed_file_order(sizes, seed, epoch):
    config = OrderingConfig(kind="window", seed=seed)
    stream = file_order_stream(sizes, config, epoch)
    files = file_order(sizes, config, epoch)
    assert_exactly_once(files, range(len(sizes)), clause="ORD-4", what="file order", repro=repro(sizes, config, epoch))
    assert_equal(stream, oracle_stream(sizes, seed, epoch), clause="ORD-4", what="stream S", repro=repro(sizes, config, epoch))
    window_one = OrderingConfig(kind="window", seed=seed, window=1)
    assert_equal(epoch_order(sizes, window_one, epoch), stream, clause="ORD-4", what="window order with w=1",
                 repro=repro(sizes, window_one, epoch))


@pytest.mark.clause("ORD-5")
def test_window_order_of_a_small_corpus_matches_the_hand_computed_one():
    assert_equal(epoch_order([2, 3, 1], OrderingConfig(kind="window", window=4), 0), [4, 0, 3, 2, 5, 1],
                 clause="ORD-5", what="window order of [2, 3, 1] with w=4")


@pytest.mark.clause("ORD-5")
@given(sizes=file_sizes, config=configs(kinds=("window",)), epoch=epochs)
def test_window_order_matches_the_textbook_window_shuffle(sizes, config, epoch):
    expected = oracle_window(oracle_stream(sizes, config.seed, epoch), config.window, config.seed, epoch)
    assert_equal(epoch_order(sizes, config, epoch), expected, clause="ORD-5", what="window order",
                 repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-5", "ORD-12")
@given(sizes=file_sizes, config=configs(kinds=("window",)), epoch=epochs)
def test_window_order_keeps_every_document_in_the_window_of_its_file_order_position(sizes, config, epoch):
    w = config.window
    source = {doc: s for s, doc in enumerate(oracle_stream(sizes, config.seed, epoch))}
    for p, doc in enumerate(epoch_order(sizes, config, epoch)):
        check(p // w == source[doc] // w and abs(p - source[doc]) <= w - 1, clause="ORD-5",
              what=f"document {doc} of file-order position {source[doc]} is at position {p}, outside its window of {w}",
              repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-5", "ORD-12")
@given(seed=seeds, epoch=epochs, w=st.integers(16, 64))
def test_window_order_moves_documents_about_a_third_of_the_window(seed, epoch, w):
    n = 2000
    config = OrderingConfig(kind="window", seed=seed, window=w)
    order = epoch_order([n], config, epoch)
    mean_shift = mean_displacement(order) * n
    check(0.2 * w <= mean_shift <= 0.45 * w, clause="ORD-5",
          what=f"mean displacement {mean_shift:.2f} positions is not about w/3 for w={w}", repro=repro([n], config, epoch))
    check(max(abs(doc - p) for p, doc in enumerate(order)) <= w - 1, clause="ORD-12",
          what="a document moved w or more positions", repro=repro([n], config, epoch))


@pytest.mark.clause("ORD-6", "ORD-7")
def test_buffer_order_of_a_small_corpus_matches_the_hand_computed_one():
    config = OrderingConfig(kind="buffer", buffer_size=3)
    assert_equal(epoch_order([2, 3, 1], config, 0), [3, 0, 1, 2, 5, 4], clause="ORD-6",
                 what="buffer order of [2, 3, 1] with b=3", repro=repro([2, 3, 1], config, 0))
    assert_equal(epoch_order([2, 1], config, 0), [2, 0, 1], clause="ORD-7",
                 what="buffer order of [2, 1] with b=3 (flush only)", repro=repro([2, 1], config, 0))


@pytest.mark.clause("ORD-6", "ORD-7")
@given(sizes=file_sizes, config=configs(kinds=("buffer",)), epoch=epochs)
def test_buffer_order_matches_the_textbook_buffered_shuffle(sizes, config, epoch):
    expected = oracle_buffer(oracle_stream(sizes, config.seed, epoch), config.buffer_size, config.seed, epoch)
    assert_equal(epoch_order(sizes, config, epoch), expected, clause="ORD-6", what="buffer order",
                 repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-6", "ORD-7")
@pytest.mark.parametrize("b", range(7))
@pytest.mark.parametrize("sizes", [[1], [5], [3, 0, 4], [2, 2, 2, 2], [0, 9, 1]])
def test_buffer_order_matches_the_textbook_buffered_shuffle_for_every_tiny_buffer(sizes, b):
    for epoch in range(4):
        config = OrderingConfig(kind="buffer", seed=7, buffer_size=b)
        expected = oracle_buffer(oracle_stream(sizes, 7, epoch), b, 7, epoch)
        assert_equal(epoch_order(sizes, config, epoch), expected, clause="ORD-6", what="buffer order",
                     repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-6")
@given(sizes=file_sizes, seed=seeds, epoch=epochs, b=st.sampled_from([0, 1]))
def test_buffer_of_at_most_one_slot_reads_the_file_order_unchanged(sizes, seed, epoch, b):
    config = OrderingConfig(kind="buffer", seed=seed, buffer_size=b)
    assert_equal(epoch_order(sizes, config, epoch), oracle_stream(sizes, seed, epoch), clause="ORD-6",
                 what=f"buffer order with b={b}", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-7")
@given(sizes=file_sizes, seed=seeds, epoch=epochs, extra=st.integers(0, 10))
def test_buffer_at_least_as_large_as_the_corpus_emits_only_the_keyed_flush(sizes, seed, epoch, extra):
    n = sum(sizes)
    assume(n >= 2)
    config = OrderingConfig(kind="buffer", seed=seed, buffer_size=n + extra)
    stream = oracle_stream(sizes, seed, epoch)
    flush = FeistelPermutation(n, subkey(derive_key(seed, epoch, Stream.BUFFER), 0))
    assert_equal(epoch_order(sizes, config, epoch), [stream[flush(i)] for i in range(n)], clause="ORD-7",
                 what="buffer order when N <= b", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-8")
@given(sizes=file_sizes, config=configs(kinds=("buffer",)), epoch=epochs)
def test_buffer_never_emits_a_document_before_it_arrives(sizes, config, epoch):
    b = max(config.buffer_size, 1)
    arrival = {doc: s for s, doc in enumerate(oracle_stream(sizes, config.seed, epoch))}
    for p, doc in enumerate(epoch_order(sizes, config, epoch)):
        check(arrival[doc] <= p + b - 1, clause="ORD-8",
              what=f"position {p} holds document {doc}, which arrives at input position {arrival[doc]} > p + b - 1",
              repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-9")
@given(sizes=file_sizes, config=configs(kinds=("sequential", "global", "window")), epoch=epochs)
def test_order_at_equals_the_epoch_order_at_every_position(sizes, config, epoch):
    order = epoch_order(sizes, config, epoch)
    assert_equal([order_at(sizes, config, epoch, p) for p in range(len(order))], order, clause="ORD-9",
                 what="order_at over all positions", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-9")
@pytest.mark.parametrize("position", [-1, 5, 6, 1.0, True])
def test_order_at_refuses_positions_outside_the_epoch(position):
    config = OrderingConfig(kind="global")
    assert_raises_typed(ConfigError, order_at, [3, 0, 2], config, 0, position, clause="ORD-9",
                        what=f"order_at(position={position!r})", mentions=["position"])


@pytest.mark.clause("ORD-10")
def test_order_at_refuses_the_buffered_shuffle_and_explains_the_replay():
    assert_raises_typed(ConfigError, order_at, [6], OrderingConfig(kind="buffer"), 0, 0, clause="ORD-10",
                        what="order_at with kind='buffer'", mentions=["buffer", "sequential", "start", "position"])


@pytest.mark.clause("ORD-10")
def test_resumed_buffered_shuffle_yields_the_rest_of_the_hand_computed_epoch():
    config = OrderingConfig(kind="buffer", buffer_size=3)
    assert_equal(epoch_order([6], config, 0), [1, 3, 4, 0, 5, 2], clause="ORD-10", what="buffer order of [6]")
    assert_equal(remaining_order([6], config, 0, 4), [5, 2], clause="ORD-10", what="order after 4 consumed")


@pytest.mark.clause("ORD-10")
@given(sizes=file_sizes, config=configs(), epoch=epochs, data=st.data())
def test_resuming_after_any_position_yields_exactly_the_rest_of_the_epoch(sizes, config, epoch, data):
    order = epoch_order(sizes, config, epoch)
    consumed = data.draw(st.integers(0, len(order)), label="consumed")
    assert_equal(order[:consumed] + remaining_order(sizes, config, epoch, consumed), order, clause="ORD-10",
                 what="consumed prefix + remaining order", repro=repro(sizes, config, epoch, consumed=consumed))


@pytest.mark.clause("ORD-10")
@pytest.mark.parametrize("consumed", [-1, 7, 2.0])
def test_resume_refuses_a_position_outside_the_epoch_as_a_bad_state(consumed):
    assert_raises_typed(StateError, remaining_order, [6], OrderingConfig(kind="buffer"), 0, consumed,
                        clause="ORD-10", what=f"remaining_order(consumed={consumed!r})", mentions=["consumed"])


CROSS_PROCESS_CASES = [([3, 0, 5, 2], {"kind": kind, "seed": 99, "window": 3, "buffer_size": 4}, 2) for kind in KINDS]

_CHILD = """
import json, sys
from reference.ordering import OrderingConfig, epoch_order
cases = json.loads(sys.argv[1])
print(json.dumps([epoch_order(sizes, OrderingConfig(**cfg), epoch) for sizes, cfg, epoch in cases]))
"""


@pytest.mark.clause("ORD-11")
def test_the_same_inputs_give_the_same_order_in_fresh_processes_with_other_hash_seeds():
    expected = [epoch_order(sizes, OrderingConfig(**cfg), epoch) for sizes, cfg, epoch in CROSS_PROCESS_CASES]
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(CROSS_PROCESS_CASES)], cwd=ROOT, env=env,
                                capture_output=True, text=True, check=True, timeout=60)
        assert_equal(json.loads(result.stdout), expected, clause="ORD-11", what=f"orders in a child with PYTHONHASHSEED={hash_seed}",
                     repro={"cases": CROSS_PROCESS_CASES})


@pytest.mark.clause("ORD-11")
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=8).filter(lambda s: sum(s) >= 10),
       kind=st.sampled_from(["global", "window", "buffer"]), seed=seeds, epoch=st.integers(0, 1000),
       later=st.integers(1, 1000), window=st.integers(8, 40), buffer_size=st.integers(4, 20))
def test_different_epochs_give_different_orders_for_every_shuffling_kind(sizes, kind, seed, epoch, later, window, buffer_size):
    config = OrderingConfig(kind=kind, seed=seed, window=window, buffer_size=buffer_size)
    first = epoch_order(sizes, config, epoch)
    check(first == epoch_order(sizes, config, epoch), clause="ORD-11", what="the same epoch gave two orders",
          repro=repro(sizes, config, epoch))
    check(first != epoch_order(sizes, config, epoch + later), clause="ORD-11",
          what=f"epochs {epoch} and {epoch + later} gave the same order", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-12")
def test_quality_measures_match_hand_computed_values():
    for order, displacement, adjacency in [([], 0.0, 0.0), ([0], 0.0, 0.0), ([1, 0, 2], 2 / 9, 0.5),
                                           ([2, 1, 0], 4 / 9, 1.0), ([0, 1, 3, 2], 2 / 16, 2 / 3), ([0, 2, 4, 1, 3], 6 / 25, 0.0)]:
        got = mean_displacement(order)
        check(math.isclose(got, displacement, abs_tol=1e-12), clause="ORD-12",
              what=f"mean_displacement({order})={got}, but should be {displacement}")
        got = adjacency_preservation(order)
        check(math.isclose(got, adjacency, abs_tol=1e-12), clause="ORD-12",
              what=f"adjacency_preservation({order})={got}, but should be {adjacency}")


@pytest.mark.clause("ORD-3", "ORD-12")
@given(seed=seeds, epoch=epochs, n=st.integers(1000, 2500))
def test_global_order_displaces_about_a_third_and_breaks_adjacency(seed, epoch, n):
    config = OrderingConfig(kind="global", seed=seed)
    order = epoch_order([n], config, epoch)
    displacement, adjacency = mean_displacement(order), adjacency_preservation(order)
    check(0.28 <= displacement <= 0.39, clause="ORD-12", what=f"mean displacement {displacement:.4f} not in [0.28, 0.39]",
          repro=repro([n], config, epoch))
    check(adjacency <= 12 / n, clause="ORD-12", what=f"adjacency {adjacency:.5f} is not near 2/N={2 / n:.5f}",
          repro=repro([n], config, epoch))


@pytest.mark.clause("ORD-12")
@given(seed=seeds, epoch=epochs, b=st.integers(16, 256))
def test_buffer_order_breaks_adjacency_far_below_sequential_reading(seed, epoch, b):
    n = 2000
    config = OrderingConfig(kind="buffer", seed=seed, buffer_size=b)
    sequential = adjacency_preservation(epoch_order([n], OrderingConfig(), epoch))
    adjacency = adjacency_preservation(epoch_order([n], config, epoch))
    check(sequential == 1.0 and adjacency < 0.15, clause="ORD-12",
          what=f"buffer adjacency {adjacency:.4f} (sequential {sequential}) is not far below 1", repro=repro([n], config, epoch))


@pytest.mark.clause("ORD-13")
@pytest.mark.parametrize("field, value", [("kind", "shuffle"), ("seed", -1), ("seed", 2**64), ("seed", True),
                                          ("window", 0), ("window", 2.0), ("buffer_size", -1), ("buffer_size", "8")])
def test_config_refuses_out_of_domain_fields_naming_them(field, value):
    assert_raises_typed(ConfigError, OrderingConfig, clause="ORD-13", what=f"OrderingConfig({field}={value!r})",
                        mentions=[f"{field}={value!r}"], **{field: value})


@pytest.mark.clause("ORD-13")
@pytest.mark.parametrize("sizes, epoch, mention", [([3, -1], 0, "file_sizes[1]"), ([2.0], 0, "file_sizes[0]"),
                                                   ([3], -1, "epoch"), ([3], 1.5, "epoch")])
def test_epoch_order_refuses_negative_or_fractional_sizes_and_epochs(sizes, epoch, mention):
    for kind in KINDS:
        assert_raises_typed(ConfigError, epoch_order, sizes, OrderingConfig(kind=kind), epoch, clause="ORD-13",
                            what=f"epoch_order({sizes}, kind={kind}, epoch={epoch})", mentions=[mention])
