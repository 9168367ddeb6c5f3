"""Meta tests: reference.sharding obeys SHARD-1..SHARD-14.

The oracles are written independently of the reference: the policy-adjusted
sequence is built as an explicit list, round robin is list slicing, and
balanced blocks come from a running cursor.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import ConfigError, TopologyError
from reference.sharding import (
    MODES,
    UNEVEN_POLICIES,
    ShardConfig,
    file_shard_sizes,
    rank_worker_indices,
    replicated_indices,
    replicated_shard_index,
    resolve_file_mode,
    shard_files,
    shard_indices,
    shard_sizes,
)

items = st.integers(min_value=0, max_value=60)
shards = st.integers(min_value=1, max_value=9)
modes = st.sampled_from(MODES)
exact_policies = st.sampled_from(["uneven", "drop_last"])
padded_policies = st.sampled_from(["repeat_last", "wrap"])
sequence_policies = st.sampled_from([u for u in UNEVEN_POLICIES if u != "repeat_own_last"])
"""The policies that pad or trim one global sequence before dealing (repeat_own_last deals first: SHARD-15)."""


def _all_shards(n: int, config: ShardConfig) -> list[list[int]]:
    return [shard_indices(n, config, r) for r in range(config.num_shards)]


def _oracle_sequence(n: int, w: int, uneven: str) -> list[int]:
    """The policy-adjusted sequence, built by appending items one at a time."""
    seq = list(range(n))
    if uneven == "drop_last":
        while len(seq) % w:
            seq.pop()
    elif uneven in ("repeat_last", "wrap") and n > 0:
        while len(seq) % w:
            seq.append(n - 1 if uneven == "repeat_last" else seq[len(seq) - n])
    return seq


def _oracle_shards(n: int, w: int, mode: str, uneven: str) -> list[list[int]]:
    seq = _oracle_sequence(n, w, uneven)
    if mode == "sequential":
        return [seq[r::w] for r in range(w)]
    out, cursor = [], 0
    for r in range(w):
        size = len(seq) // w + (1 if r < len(seq) % w else 0)
        out.append(seq[cursor:cursor + size])
        cursor += size
    return out


@pytest.mark.clause("SHARD-1", "SHARD-2", "SHARD-3", "SHARD-4", "SHARD-5", "SHARD-6")
@given(n=items, w=shards, mode=modes, uneven=sequence_policies)
def test_every_shard_equals_the_independent_oracle_for_every_layout_and_policy(n, w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    clause = "SHARD-1" if mode == "sequential" else "SHARD-2"
    assert_equal(_all_shards(n, config), _oracle_shards(n, w, mode, uneven), clause=clause, what="shards",
                 repro={"n": n, "config": config})


@pytest.mark.clause("SHARD-3", "SHARD-4")
@given(n=items, w=shards, mode=modes, uneven=exact_policies)
def test_uneven_and_drop_last_shards_cover_their_items_exactly_once_and_are_disjoint(n, w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    clause = "SHARD-3" if uneven == "uneven" else "SHARD-4"
    covered = n if uneven == "uneven" else (n // w) * w
    all_items = [i for shard in _all_shards(n, config) for i in shard]
    assert_exactly_once(all_items, range(covered), clause=clause, what="items over all shards",
                        repro={"n": n, "config": config})


@pytest.mark.clause("SHARD-3", "SHARD-4")
def test_uneven_and_drop_last_cover_exactly_once_for_every_n_up_to_60_and_every_w_up_to_9():
    for n in range(61):
        for w in range(1, 10):
            for mode in MODES:
                for uneven in ("uneven", "drop_last"):
                    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
                    covered = n if uneven == "uneven" else (n // w) * w
                    assert_exactly_once([i for shard in _all_shards(n, config) for i in shard], range(covered),
                                        clause="SHARD-3" if uneven == "uneven" else "SHARD-4",
                                        what="items over all shards", repro={"n": n, "config": config})


@pytest.mark.clause("SHARD-3", "SHARD-4")
@given(n=items, w=shards, mode=modes, uneven=exact_policies)
def test_shard_sizes_differ_by_at_most_one_and_drop_last_sizes_are_all_the_floor(n, w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    sizes = [len(s) for s in _all_shards(n, config)]
    repro = {"n": n, "config": config, "sizes": sizes}
    check(max(sizes) - min(sizes) <= 1, clause="SHARD-3", what="shard sizes differ by more than one", repro=repro)
    if uneven == "drop_last":
        assert_equal(sizes, [n // w] * w, clause="SHARD-4", what="drop_last sizes", repro=repro)


@pytest.mark.clause("SHARD-5", "SHARD-6")
@given(n=st.integers(min_value=1, max_value=60), w=shards, mode=modes, uneven=padded_policies)
def test_padded_shards_all_have_the_ceiling_size_and_repeat_only_allowed_items(n, w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    clause = "SHARD-5" if uneven == "repeat_last" else "SHARD-6"
    result = _all_shards(n, config)
    repro = {"n": n, "config": config}
    ceiling = -(-n // w)
    assert_equal([len(s) for s in result], [ceiling] * w, clause=clause, what="padded shard sizes", repro=repro)
    flat = [i for s in result for i in s]
    padding = ceiling * w - n
    check(set(range(n)) <= set(flat), clause=clause, what="an item is missing from the padded shards", repro=repro)
    extra = sorted(flat)
    for i in range(n):
        extra.remove(i)
    allowed = [n - 1] * padding if uneven == "repeat_last" else sorted(i % n for i in range(padding))
    assert_equal(extra, allowed, clause=clause, what="the padding items", repro=repro)


@pytest.mark.clause("SHARD-7")
@given(w=shards, mode=modes, uneven=sequence_policies)
def test_zero_items_give_empty_shards_under_every_policy(w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    assert_equal(_all_shards(0, config), [[] for _ in range(w)], clause="SHARD-7", what="shards of n=0",
                 repro={"config": config})
    assert_equal(shard_sizes(0, config), [0] * w, clause="SHARD-7", what="shard sizes of n=0", repro={"config": config})


@pytest.mark.clause("SHARD-7")
def test_fewer_items_than_shards_leave_shards_empty_or_padded_by_policy():
    assert_equal(_all_shards(2, ShardConfig(num_shards=3)), [[0], [1], []], clause="SHARD-7", what="uneven n=2 W=3")
    assert_equal(_all_shards(2, ShardConfig(num_shards=3, uneven="drop_last")), [[], [], []], clause="SHARD-7",
                 what="drop_last n=2 W=3")
    assert_equal(_all_shards(2, ShardConfig(num_shards=3, uneven="repeat_last")), [[0], [1], [1]], clause="SHARD-7",
                 what="repeat_last n=2 W=3")
    assert_equal(_all_shards(2, ShardConfig(num_shards=3, mode="chunked", uneven="wrap")), [[0], [1], [0]],
                 clause="SHARD-7", what="wrap n=2 W=3")


@pytest.mark.clause("SHARD-1", "SHARD-2")
def test_d9d_documentation_examples_for_fourteen_items_over_four_shards():
    sequential = _all_shards(14, ShardConfig(num_shards=4))
    assert_equal(sequential, [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10], [3, 7, 11]], clause="SHARD-1",
                 what="sequential n=14 W=4")
    chunked = _all_shards(14, ShardConfig(num_shards=4, mode="chunked"))
    assert_equal(chunked, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [11, 12, 13]], clause="SHARD-2",
                 what="chunked n=14 W=4 (balanced 4,4,3,3, not d9d's 4,4,4,2)")


@pytest.mark.clause("SHARD-4", "SHARD-5", "SHARD-6")
def test_hand_computed_remainder_policies_for_fourteen_items_over_four_shards():
    assert_equal(_all_shards(14, ShardConfig(num_shards=4, uneven="drop_last")),
                 [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]], clause="SHARD-4", what="drop_last")
    assert_equal(_all_shards(14, ShardConfig(num_shards=4, uneven="repeat_last")),
                 [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 13], [3, 7, 11, 13]], clause="SHARD-5", what="repeat_last")
    assert_equal(_all_shards(14, ShardConfig(num_shards=4, mode="chunked", uneven="wrap")),
                 [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 0, 1]], clause="SHARD-6", what="chunked wrap")


@pytest.mark.clause("SHARD-8")
@given(n=items, w=shards, mode=modes, uneven=sequence_policies)
def test_shard_sizes_match_the_materialised_shards(n, w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    assert_equal(shard_sizes(n, config), [len(s) for s in _oracle_shards(n, w, mode, uneven)], clause="SHARD-8",
                 what="shard_sizes", repro={"n": n, "config": config})


file_lists = st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=10)


def _file_major_ids(file_sizes: list[int]) -> list[list[int]]:
    out, next_id = [], 0
    for size in file_sizes:
        out.append(list(range(next_id, next_id + size)))
        next_id += size
    return out


@pytest.mark.clause("SHARD-9")
@given(file_sizes=file_lists.filter(len), w=shards)
def test_file_level_shards_hold_whole_files_round_robin(file_sizes, w):
    if w > len(file_sizes):
        assert_raises_typed(TopologyError, shard_files, file_sizes, w, 0, mode="file", clause="SHARD-9",
                            what="file mode with more shards than files", mentions=["mode='example'"])
        return
    ids = _file_major_ids(file_sizes)
    repro = {"file_sizes": file_sizes, "num_shards": w}
    for r in range(w):
        expected = [e for f in range(len(file_sizes)) if f % w == r for e in ids[f]]
        assert_equal(shard_files(file_sizes, w, r, mode="file"), expected, clause="SHARD-9", what=f"file shard {r}",
                     repro=repro)
    assert_equal(file_shard_sizes(file_sizes, w, mode="file"), [len(shard_files(file_sizes, w, r, mode="file"))
                                                                for r in range(w)], clause="SHARD-9",
                 what="file_shard_sizes", repro=repro)


@pytest.mark.clause("SHARD-9")
def test_file_level_shards_can_be_very_unequal_which_is_the_documented_trade_off():
    assert_equal(file_shard_sizes([100, 1, 1, 1], 2, mode="file"), [101, 2], clause="SHARD-9",
                 what="file shard sizes of files 100,1,1,1")


@pytest.mark.clause("SHARD-10")
@given(file_sizes=file_lists, w=shards)
def test_example_level_shards_split_all_examples_in_balanced_blocks(file_sizes, w):
    total = sum(file_sizes)
    result = [shard_files(file_sizes, w, r, mode="example") for r in range(w)]
    repro = {"file_sizes": file_sizes, "num_shards": w}
    assert_equal([i for s in result for i in s], list(range(total)), clause="SHARD-10",
                 what="concatenated example shards", repro=repro)
    sizes = [len(s) for s in result]
    check(max(sizes) - min(sizes) <= 1, clause="SHARD-10", what=f"example shard sizes {sizes} differ by more than one",
          repro=repro)
    check(sizes == sorted(sizes, reverse=True), clause="SHARD-10", what=f"larger blocks must come first: {sizes}",
          repro=repro)
    assert_equal(file_shard_sizes(file_sizes, w, mode="example"), sizes, clause="SHARD-10", what="file_shard_sizes",
                 repro=repro)


@pytest.mark.clause("SHARD-11")
@given(file_sizes=file_lists, w=shards)
def test_auto_mode_is_file_level_exactly_when_every_shard_can_get_a_file(file_sizes, w):
    expected_mode = "file" if w <= len(file_sizes) else "example"
    repro = {"file_sizes": file_sizes, "num_shards": w}
    assert_equal(resolve_file_mode(len(file_sizes), w), expected_mode, clause="SHARD-11", what="resolved mode",
                 repro=repro)
    for r in range(w):
        assert_equal(shard_files(file_sizes, w, r), shard_files(file_sizes, w, r, mode=expected_mode),
                     clause="SHARD-11", what=f"auto shard {r}", repro=repro)


@pytest.mark.clause("SHARD-12")
@given(n=items, world=st.integers(min_value=1, max_value=5), workers=st.integers(min_value=1, max_value=4),
       mode=modes, uneven=sequence_policies)
def test_rank_worker_lists_are_disjoint_and_cover_exactly_once(n, world, workers, mode, uneven):
    lists = {(r, w): rank_worker_indices(n, world_size=world, rank=r, num_workers=workers, worker=w, mode=mode,
                                         uneven=uneven)
             for r in range(world) for w in range(workers)}
    repro = {"n": n, "world_size": world, "num_workers": workers, "mode": mode, "uneven": uneven}
    rank_lists = _oracle_shards(n, world, mode, uneven)
    for (r, w), got in lists.items():
        assert_equal(got, rank_lists[r][w::workers], clause="SHARD-12", what=f"rank {r} worker {w}", repro=repro)
    if uneven in ("uneven", "drop_last"):
        covered = n if uneven == "uneven" else (n // world) * world
        assert_exactly_once([i for got in lists.values() for i in got], range(covered), clause="SHARD-12",
                            what="items over all (rank, worker) pairs", repro=repro)


@pytest.mark.clause("SHARD-12")
def test_hand_computed_rank_worker_split():
    got = [[rank_worker_indices(10, world_size=2, rank=r, num_workers=2, worker=w) for w in range(2)] for r in range(2)]
    assert_equal(got, [[[0, 4, 8], [2, 6]], [[1, 5, 9], [3, 7]]], clause="SHARD-12", what="n=10, 2 ranks x 2 workers")


@pytest.mark.clause("SHARD-13")
@given(n=items, groups=st.integers(min_value=1, max_value=4), k=st.integers(min_value=1, max_value=3), mode=modes,
       uneven=sequence_policies)
def test_replicated_ranks_see_identical_data_and_groups_shard_over_world_over_k(n, groups, k, mode, uneven):
    world = groups * k
    config = ShardConfig(num_shards=world, mode=mode, uneven=uneven)
    repro = {"n": n, "world_size": world, "replication": k, "config": config}
    per_rank = [replicated_indices(n, config, r, world, k) for r in range(world)]
    expected = _oracle_shards(n, groups, mode, uneven)
    for r in range(world):
        assert_equal(replicated_shard_index(r, world, k), r // k, clause="SHARD-13", what=f"shard of rank {r}",
                     repro=repro)
        assert_equal(per_rank[r], expected[r // k], clause="SHARD-13", what=f"items of rank {r}", repro=repro)


@pytest.mark.clause("SHARD-13")
def test_replication_that_does_not_divide_the_world_is_refused():
    assert_raises_typed(TopologyError, replicated_shard_index, 0, 6, 4, clause="SHARD-13",
                        what="replication 4 of world 6", mentions=["replication=4", "world_size=6", "divide"])


@pytest.mark.clause("SHARD-14")
def test_impossible_configurations_and_topologies_are_refused_with_the_fix():
    assert_raises_typed(ConfigError, ShardConfig, num_shards=0, clause="SHARD-14", what="num_shards=0",
                        mentions=["num_shards=0"])
    assert_raises_typed(ConfigError, ShardConfig, num_shards=2, mode="strided", clause="SHARD-14", what="bad mode",
                        mentions=["mode", "sequential"])
    assert_raises_typed(ConfigError, ShardConfig, num_shards=2, uneven="pad", clause="SHARD-14", what="bad uneven",
                        mentions=["uneven", "drop_last"])
    assert_raises_typed(ConfigError, shard_indices, -1, ShardConfig(num_shards=2), 0, clause="SHARD-14",
                        what="n=-1", mentions=["n=-1"])
    assert_raises_typed(TopologyError, shard_indices, 10, ShardConfig(num_shards=4), 4, clause="SHARD-14",
                        what="shard_index=4 of 4", mentions=["shard_index=4", "num_shards=4"])
    assert_raises_typed(TopologyError, rank_worker_indices, 10, world_size=2, rank=2, num_workers=1, worker=0,
                        clause="SHARD-14", what="rank=2 of 2", mentions=["rank=2", "world_size=2"])
    assert_raises_typed(TopologyError, rank_worker_indices, 10, world_size=2, rank=0, num_workers=0, worker=0,
                        clause="SHARD-14", what="num_workers=0", mentions=["num_workers=0", "num_workers=1"])
    assert_raises_typed(TopologyError, rank_worker_indices, 10, world_size=2, rank=0, num_workers=2, worker=2,
                        clause="SHARD-14", what="worker=2 of 2", mentions=["worker=2"])
    assert_raises_typed(TopologyError, replicated_indices, 10, ShardConfig(num_shards=2), 0, 4, 2, clause="SHARD-14",
                        what="config_for_world with num_shards != world_size", mentions=["num_shards", "world_size=4"])


def _oracle_own_last(n: int, w: int, mode: str) -> list[list[int]]:
    """Deal the items as under ``uneven``, then append each short shard's own last item until it has ceil(n/w)."""
    shards = _oracle_shards(n, w, mode, "uneven")
    ceiling = -(-n // w)
    for shard in shards:
        while len(shard) < ceiling:
            shard.append(shard[-1])
    return shards


@pytest.mark.clause("SHARD-15")
@given(n=items, w=shards, mode=modes)
def test_repeat_own_last_pads_every_shard_to_the_ceiling_with_its_own_items_only(n, w, mode):
    config = ShardConfig(num_shards=w, mode=mode, uneven="repeat_own_last")
    repro = {"n": n, "config": config}
    if 0 < n < w:
        assert_raises_typed(TopologyError, shard_indices, n, config, 0, clause="SHARD-15",
                            what="repeat_own_last with fewer items than shards", mentions=[f"n={n}", "wrap"])
        return
    result = _all_shards(n, config)
    assert_equal(result, _oracle_own_last(n, w, mode), clause="SHARD-15", what="shards", repro=repro)
    assert_equal(shard_sizes(n, config), [-(-n // w)] * w, clause="SHARD-15", what="shard sizes", repro=repro)
    owners = {i: r for r, shard in enumerate(_oracle_shards(n, w, mode, "uneven")) for i in shard}
    for r, shard in enumerate(result):
        check(all(owners[i] == r for i in shard), clause="SHARD-15", what=f"shard {r} holds another shard's item",
              repro=repro)
    assert_exactly_once(sorted({i for s in result for i in s}), range(n), clause="SHARD-15",
                        what="distinct items over all shards", repro=repro)


@pytest.mark.clause("SHARD-15")
def test_repeat_own_last_hand_computed_for_fourteen_items_over_four_shards():
    assert_equal(_all_shards(14, ShardConfig(num_shards=4, uneven="repeat_own_last")),
                 [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 10], [3, 7, 11, 11]], clause="SHARD-15",
                 what="sequential repeat_own_last")
    assert_equal(_all_shards(14, ShardConfig(num_shards=4, mode="chunked", uneven="repeat_own_last")),
                 [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 10], [11, 12, 13, 13]], clause="SHARD-15",
                 what="chunked repeat_own_last")
