"""impl.ordering against reference.ordering: the same order, bit for bit, for every random-access kind.

The reference is the oracle: ``impl.ordering.epoch_order`` must equal
``reference.ordering.epoch_order`` and ``order_at`` must equal the reference's
``order_at`` at every position asked, for kinds sequential, global and window,
on the kit's adversarial corpora (empty files, single documents, many tiny
files) and on corpora of a few thousand documents, where window counts and
Feistel cycle-walking get exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.assertions import assert_equal, assert_raises_typed
from impl import ordering as io
from impl.errors import ConfigError
from impl.rng import ScalarFeistel, feistel
from reference import ordering as ro
from reference.ordering import OrderingConfig
from reference.rng import FeistelPermutation as ReferenceFeistel

RANDOM_ACCESS = ("sequential", "global", "window")
epochs = st.integers(0, 5)


def sizes_of(corpus) -> list[int]:
    return [len(f) for f in corpus]


def repro(sizes, config, epoch, **extra):
    return {"file_sizes": sizes, "config": config, "epoch": epoch, **extra}


big_sizes = st.lists(st.integers(0, 1500), min_size=1, max_size=6).filter(lambda s: sum(s) <= 4000)
big_configs = st.builds(lambda kind, seed, window: OrderingConfig(kind=kind, seed=seed, window=window),
                        st.sampled_from(RANDOM_ACCESS), ls.seeds, st.sampled_from([1, 2, 7, 64, 1000, 1024, 5000]))


@pytest.mark.clause("ORD-1", "ORD-2", "ORD-3", "ORD-4", "ORD-5", "ORD-11")
@given(corpus=ls.corpora(), config=ls.ordering_configs(RANDOM_ACCESS), epoch=epochs)
def test_impl_epoch_order_equals_the_reference_order_on_adversarial_corpora(corpus, config, epoch):
    sizes = sizes_of(corpus)
    got = io.epoch_order(sizes, config, epoch)
    assert_equal(got.dtype, np.dtype(np.int64), clause="ORD-1", what="dtype of the order", repro=repro(sizes, config, epoch))
    assert_equal(got.tolist(), ro.epoch_order(sizes, config, epoch), clause="ORD-1", what="impl epoch order",
                 repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-3", "ORD-5", "ORD-11")
@given(sizes=big_sizes, config=big_configs, epoch=epochs)
def test_impl_epoch_order_equals_the_reference_order_for_thousands_of_documents(sizes, config, epoch):
    assert_equal(io.epoch_order(sizes, config, epoch).tolist(), ro.epoch_order(sizes, config, epoch), clause="ORD-5",
                 what="impl epoch order", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-9")
@given(sizes=big_sizes, config=big_configs, epoch=epochs, data=st.data())
def test_order_at_equals_the_reference_at_any_positions_without_computing_the_order(sizes, config, epoch, data):
    n = sum(sizes)
    # up to 80 positions: EpochOrder answers few positions with scalar Feistel, many with numpy; both must agree
    positions = data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=80)) if n else []
    got = io.order_at(sizes, config, epoch, np.array(positions, dtype=np.int64))
    expected = [ro.order_at(sizes, config, epoch, p) for p in positions]
    assert_equal(got.tolist(), expected, clause="ORD-9", what=f"order_at{positions}", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-9")
@given(corpus=ls.corpora(), config=ls.ordering_configs(RANDOM_ACCESS), epoch=epochs)
def test_epoch_order_object_answers_every_position_like_the_reference_order(corpus, config, epoch):
    sizes = sizes_of(corpus)
    order = io.EpochOrder(sizes, config, epoch)
    n = sum(sizes)
    reversed_positions = np.arange(n - 1, -1, -1, dtype=np.int64)
    assert_equal(order(reversed_positions).tolist(), ro.epoch_order(sizes, config, epoch)[::-1], clause="ORD-9",
                 what="EpochOrder at reversed positions", repro=repro(sizes, config, epoch))
    assert_equal(len(order), n, clause="ORD-9", what="len(EpochOrder)", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-9")
def test_order_at_keeps_the_shape_of_its_positions_and_accepts_a_plain_int():
    config = OrderingConfig(kind="window", window=2)
    grid = io.order_at([3, 0, 2], config, 0, np.array([[0, 1], [3, 4]]))
    assert_equal(grid.tolist(), [[1, 0], [2, 4]], clause="ORD-9", what="order_at on a 2x2 grid")
    assert_equal(int(io.order_at([3, 0, 2], OrderingConfig(kind="global"), 0, 0)), 4, clause="ORD-9",
                 what="order_at(..., 0) for the reference's worked example")


@pytest.mark.clause("ORD-4")
@given(corpus=ls.corpora(), config=ls.ordering_configs(RANDOM_ACCESS), epoch=epochs)
def test_file_order_equals_the_reference_file_order(corpus, config, epoch):
    sizes = sizes_of(corpus)
    assert_equal(io.file_order(sizes, config, epoch).tolist(), ro.file_order(sizes, config, epoch), clause="ORD-4",
                 what="file order", repro=repro(sizes, config, epoch))


@pytest.mark.clause("ORD-10")
def test_buffer_kind_is_refused_with_not_implemented_naming_the_random_access_alternatives():
    config = OrderingConfig(kind="buffer", buffer_size=3)
    for fn, args in ((io.epoch_order, ([6], config, 0)), (io.order_at, ([6], config, 0, 0)),
                     (io.EpochOrder, ([6], config, 0))):
        assert_raises_typed(NotImplementedError, fn, *args, clause="ORD-10", what=f"{fn.__name__} with kind='buffer'",
                            mentions=["buffer", "global", "window", "sequential by nature"])


@pytest.mark.clause("ORD-9", "ORD-13")
def test_bad_positions_file_sizes_and_epochs_raise_config_errors_naming_the_field():
    config = OrderingConfig(kind="global")
    assert_raises_typed(ConfigError, io.order_at, [3, 0, 2], config, 0, np.array([5]), clause="ORD-9",
                        what="position N", mentions=["position=5", "N=5"])
    assert_raises_typed(ConfigError, io.order_at, [3, 0, 2], config, 0, -1, clause="ORD-9", what="position -1",
                        mentions=["position=-1"])
    assert_raises_typed(ConfigError, io.epoch_order, [3, -1], config, 0, clause="ORD-13", what="negative file size",
                        mentions=["file_sizes[1]"])
    assert_raises_typed(ConfigError, io.epoch_order, [3, True], config, 0, clause="ORD-13", what="bool file size",
                        mentions=["file_sizes[1]"])
    assert_raises_typed(ConfigError, io.epoch_order, [3], config, -1, clause="ORD-13", what="negative epoch",
                        mentions=["epoch=-1"])
    assert_raises_typed(ConfigError, io.epoch_order, [3], "global", 0, clause="ORD-13", what="a string config",
                        mentions=["OrderingConfig"])


@pytest.mark.clause("ORD-1")
@pytest.mark.parametrize("kind", RANDOM_ACCESS)
@pytest.mark.parametrize("sizes", [[], [0], [0, 0, 0], [1], [0, 1, 0], [0, 0, 5, 0, 2]])
def test_every_kind_handles_no_documents_one_document_and_empty_files_like_the_reference(kind, sizes):
    config = OrderingConfig(kind=kind, window=2)
    assert_equal(io.epoch_order(sizes, config, 4).tolist(), ro.epoch_order(sizes, config, 4), clause="ORD-1",
                 what="impl epoch order", repro=repro(sizes, config, 4))


@pytest.mark.clause("ORD-5")
def test_window_order_of_a_million_documents_equals_the_reference_on_sampled_positions():
    sizes = [250_000, 0, 400_000, 350_000]
    config = OrderingConfig(kind="window", window=1000, seed=7)
    order = io.epoch_order(sizes, config, 2)
    probe = [0, 1, 999, 1000, 249_999, 250_000, 650_123, 999_000, 999_999]
    assert_equal(order[probe].tolist(), [ro.order_at(sizes, config, 2, p) for p in probe], clause="ORD-5",
                 what="window order at probe positions", repro=repro(sizes, config, 2))
    assert_equal(int(np.bincount(order, minlength=sum(sizes)).max()), 1, clause="ORD-1",
                 what="largest number of times a document appears")


@pytest.mark.clause("ORD-9", "RNG-5")
@pytest.mark.parametrize("kind", ("global", "window"))
def test_few_positions_and_many_positions_give_the_same_documents(kind):
    sizes = [700, 0, 1300, 5]
    config = OrderingConfig(kind=kind, window=64, seed=11)
    order = io.EpochOrder(sizes, config, 1)
    many = np.arange(0, 2005, 7, dtype=np.int64)                 # numpy Feistel
    few = [order(many[i:i + 3]) for i in range(0, len(many), 3)]  # scalar Feistel
    assert_equal(np.concatenate(few).tolist(), order(many).tolist(), clause="ORD-9", what=f"{kind} order, few vs many")
    expected = ro.epoch_order(sizes, config, 1)
    assert_equal(order(many).tolist(), [expected[p] for p in many.tolist()], clause="ORD-9",
                 what=f"{kind} order vs reference")


permutation_sizes = st.one_of(st.integers(1, 5000), st.sampled_from([4 ** k + d for k in range(1, 31) for d in (-1, 0, 1)]),
                              st.integers(1, 2 ** 62))


@pytest.mark.clause("ORD-9", "RNG-5")
@given(n=permutation_sizes, key=st.integers(0, 2 ** 64 - 1), data=st.data())
def test_the_batched_feistel_pass_equals_the_scalar_network_and_the_reference_at_any_positions(n, key, data):
    """``impl.rng.feistel`` (in-place array passes, cycle-walks batched or finished by ``ScalarFeistel``) is bit for bit RNG-5.

    Sizes just above a power of 4 send most positions round the cycle again
    (several batched passes); just below, a few (finished by the scalar network).
    """
    positions = data.draw(st.lists(st.integers(0, n - 1), max_size=300))
    scalar = ScalarFeistel(n, key)
    reference = ReferenceFeistel(n, key)
    for finish in (scalar, None):
        got = feistel(n, key, np.array(positions, dtype=np.int64), finish=finish)
        assert_equal(got.dtype, np.dtype(np.int64), clause="RNG-5", what="dtype of the batched images")
        assert_equal(got.tolist(), [reference(p) for p in positions], clause="RNG-5",
                     what=f"batched Feistel images of {positions} (n={n}, key={key}, finish={finish})")
    assert_equal(got.tolist(), [scalar(p) for p in positions], clause="RNG-5",
                 what=f"batched vs ScalarFeistel (n={n}, key={key})")


lookups = st.lists(st.tuples(st.booleans(), st.integers(0, 10**6), st.integers(1, 40)), min_size=1, max_size=25)


@pytest.mark.clause("ORD-9", "RNG-5")
@given(sizes=big_sizes, config=big_configs.filter(lambda c: c.kind != "sequential"), epoch=epochs,
       block=st.sampled_from([1, 3, 16, 2048]), calls=lookups)
def test_cached_blocks_answer_sequential_and_random_lookups_like_the_reference(sizes, config, epoch, block, calls):
    """Runs of consecutive positions (a loader) fill and evict cached blocks; jumps (random ``ds[i]``) must not care."""
    n = sum(sizes)
    if n == 0:
        return
    expected = ro.epoch_order(sizes, config, epoch)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(io, "BLOCK", block)
        order = io.EpochOrder(sizes, config, epoch)
        at = 0
        for jump, where, count in calls:
            at = where % n if jump else at
            pos = np.arange(at, min(at + count, n), dtype=np.int64)
            at = int(pos[-1]) + 1 if int(pos[-1]) + 1 < n else 0
            assert_equal(order(pos).tolist(), [expected[p] for p in pos.tolist()], clause="ORD-9",
                         what=f"{config.kind} order at positions {pos[0]}..{pos[-1]} (block {block})",
                         repro=repro(sizes, config, epoch, calls=calls))
            assert len(order._blocks) <= io.BLOCKS_KEPT


@pytest.mark.clause("ORD-9")
@pytest.mark.parametrize("kind", ("global", "window"))
def test_a_sequential_reader_evaluates_each_block_once_and_a_random_reader_none(kind, monkeypatch):
    sizes = [5000, 3000]
    config = OrderingConfig(kind=kind, window=100, seed=3)
    expected = ro.epoch_order(sizes, config, 0)
    monkeypatch.setattr(io, "BLOCK", 256)
    evaluated = []
    real_vector = io.EpochOrder._vector
    monkeypatch.setattr(io.EpochOrder, "_vector", lambda self, pos: evaluated.append(len(pos)) or real_vector(self, pos))
    order = io.EpochOrder(sizes, config, 0)
    for start in range(0, 8000, 25):          # a loader: runs of 25 consecutive positions
        pos = np.arange(start, min(start + 25, 8000))
        assert order(pos).tolist() == [expected[p] for p in pos.tolist()]
    # the first run, before any streak, is evaluated on its own (batched for a global order, scalar for a window one)
    first = [25] if kind == "global" else []
    assert evaluated == first + [256] * 31 + [8000 - 31 * 256]
    assert len(order._blocks) == io.BLOCKS_KEPT
    evaluated.clear()
    fresh = io.EpochOrder(sizes, config, 0)
    for p in np.random.default_rng(0).permutation(8000)[:200].tolist():   # isolated lookups: mostly scalar
        assert fresh(np.array([p])).tolist() == [expected[p]]
    assert len(evaluated) < 200 // 4, f"{len(evaluated)} of 200 random lookups evaluated a whole block"


@pytest.mark.clause("ORD-9")
def test_threads_sharing_one_order_get_the_reference_documents(monkeypatch):
    """A dataset may be read from a thread pool (torchdata nodes); the block cache must stay correct."""
    from concurrent.futures import ThreadPoolExecutor

    sizes = [3000, 2000]
    config = OrderingConfig(kind="global", seed=5)
    expected = ro.epoch_order(sizes, config, 0)
    monkeypatch.setattr(io, "BLOCK", 64)
    order = io.EpochOrder(sizes, config, 0)

    def reader(offset: int) -> bool:
        ok = True
        for start in range(offset, 5000, 40):
            pos = np.arange(start, min(start + 20, 5000))
            ok &= order(pos).tolist() == [expected[p] for p in pos.tolist()]
        return ok

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(reader, range(0, 40, 10)))
    assert len(order._blocks) <= io.BLOCKS_KEPT + 4
