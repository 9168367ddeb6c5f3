"""Meta tests: reference.stream_mixing obeys MIX-22..MIX-25 (mixtures of streaming sources and token stores).

The oracles are written from the clause text: a store's lane is a slice of
``reference.resume.epoch_samples``, a streaming lane is
``reference.streaming.lane_samples``, and the draws are redone here with
``reference.rng.unit`` and a cumulative sum, never by the code under test.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import ConfigError, StateError, TopologyError
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, epoch_samples
from reference.rng import Stream, derive_key, subkey, unit
from reference.stream_mixing import (
    MixReader,
    StoreSource,
    StreamMixConfig,
    StreamMixReferenceLoader,
    StreamSource,
    mixed_lane,
    mixture_lanes,
    planned_options_refused,
)
from reference.streaming import StreamingConfig, lane_samples, merge_states
from reference.units import RowFile, TextFile

words = st.text(alphabet="abcd ", max_size=7)


def tok(text):
    """A character tokenizer: every character is one token."""
    return [1 + "abcd ".index(c) for c in text]


@st.composite
def mixtures(draw, lanes=None):
    """(sources, config): one or two streaming sources and zero to two stores, one packing, positive weights."""
    seq_len = draw(st.integers(1, 4))
    packing = PackingConfig(seq_len=seq_len, mode=draw(st.sampled_from(["concat", "chunk"])))
    num_lanes = draw(st.sampled_from([1, 2, 4])) if lanes is None else lanes
    sources: list[StoreSource | StreamSource] = []
    for i in range(draw(st.integers(0, 2))):
        corpus = [draw(st.lists(st.lists(st.integers(1, 9), max_size=6), max_size=5)) for _ in range(2)]
        shuffled = draw(st.booleans())
        from reference.ordering import OrderingConfig

        ordering = OrderingConfig(kind="global", seed=i) if shuffled else OrderingConfig()
        sources.append(StoreSource(corpus=corpus, config=PipelineConfig(packing=packing, ordering=ordering)))
    for i in range(draw(st.integers(1, 2))):
        rows = draw(st.lists(words, max_size=8))
        cut = draw(st.integers(0, len(rows)))
        fs = [RowFile(path=f"s{i}.parquet", groups=(tuple(rows[:cut]), tuple(rows[cut:])), size=len(rows), etag="1"),
              TextFile(path=f"s{i}.txt", data="".join(r + "\n" for r in rows).encode(), format="txt", etag="1")]
        shuffle = draw(st.booleans())
        config = StreamingConfig(packing=packing, num_lanes=num_lanes, seed=draw(st.integers(0, 2**32)),
                                 shuffle=shuffle, shuffle_buffer_size=draw(st.integers(0, 3)) if shuffle else 0,
                                 unit_bytes=draw(st.integers(1, 8)))
        sources.append(StreamSource(files=fs, config=config, tokenizer=tok, tokenizer_id="chars"))
    order = draw(st.permutations(range(len(sources))))
    sources = [sources[i] for i in order]
    weights = tuple(draw(st.lists(st.floats(0.1, 5.0), min_size=len(sources), max_size=len(sources))))
    config = StreamMixConfig(weights=weights, stopping=draw(st.sampled_from(["first_exhausted", "all_exhausted"])),
                             seed=draw(st.integers(0, 2**32)))
    return sources, config


def source_lane(source, config, num_lanes, epoch, lane):
    """Source ``source``'s lane ``lane`` by the clause: a slice of the store's epoch, or the stream's lane (MIX-22)."""
    if isinstance(source, StoreSource):
        return epoch_samples(source.corpus, source.config, epoch)[lane::num_lanes]
    return lane_samples(source.files, source.config, source.tokenizer, epoch, lane)


def oracle_lane(sources, config, epoch, lane):
    """MIX-23 redone: draw per attempt, walk the cumulative weights, end or drop out on an empty source."""
    n = mixture_lanes(sources, config)
    lanes = [source_lane(s, config, n, epoch, lane) for s in sources]
    taken, exhausted, out, t = [0] * len(sources), [False] * len(sources), [], 0
    key = subkey(derive_key(config.seed, epoch, Stream.MIX), lane)
    while not all(exhausted):
        weights = [0.0 if exhausted[i] else w for i, w in enumerate(config.weights)]
        total, running, u, chosen = sum(weights), 0.0, unit(key, t), None
        for i, w in enumerate(weights):
            running += w
            if chosen is None and u < running / total:
                chosen = i
        t += 1
        if taken[chosen] == len(lanes[chosen]):
            if config.stopping == "first_exhausted":
                break
            exhausted[chosen] = True
            continue
        out.append((chosen, lanes[chosen][taken[chosen]]))
        taken[chosen] += 1
    return out, lanes


def run(loader, steps):
    """The next ``steps`` batches across epochs; a pass that ends a resumed epoch may yield nothing (as RES-7)."""
    out, empty = [], 0
    while len(out) < steps and empty < 2:
        before = len(out)
        for batch in loader:
            out.append(batch)
            if len(out) == steps:
                break
        empty = empty + 1 if len(out) == before else 0
    return out


def take(loader, steps):
    """The next ``steps`` batches of one pass, leaving the pass open (the state then counts exactly these)."""
    it, out = iter(loader), []
    while len(out) < steps:
        out.append(next(it))
    return out


def epochs(loader, count):
    """Every batch of the next ``count`` passes."""
    return [batch for _ in range(count) for batch in loader]


def key(rows):
    return [[(r.epoch, r.lane, r.index, r.source, r.source_index, r.sample) for r in b] for b in rows]


@pytest.mark.clause("MIX-22")
@given(mix=mixtures(), epoch=st.integers(0, 2))
def test_a_store_lane_reads_every_nth_sample_of_its_epoch_in_order(mix, epoch):
    sources, config = mix
    n = mixture_lanes(sources, config)
    reader = MixReader(sources, config, n)
    for i, source in enumerate(sources):
        if not isinstance(source, StoreSource):
            continue
        samples = epoch_samples(source.corpus, source.config, epoch)
        for lane in range(n):
            got, position = [], 0
            while (step := reader.next(i, epoch, lane, position)) is not None:
                got.append((step[0], step[1]))
                position = step[2]
            assert_equal(got, [(j, samples[j]) for j in range(lane, len(samples), n)], clause="MIX-22",
                         what=f"lane {lane} of store source {i}")


@pytest.mark.clause("MIX-22")
def test_streaming_sources_with_other_lane_counts_or_shapes_or_no_stream_are_refused():
    p = PackingConfig(seq_len=2)
    fs = [RowFile(path="a", groups=(("ab",),))]
    four = StreamSource(files=fs, config=StreamingConfig(packing=p, num_lanes=4), tokenizer=tok, tokenizer_id="c")
    two = StreamSource(files=fs, config=StreamingConfig(packing=p, num_lanes=2), tokenizer=tok, tokenizer_id="c")
    wide = StoreSource(corpus=[[[1, 2, 3]]], config=PipelineConfig(packing=PackingConfig(seq_len=3)))
    cfg = StreamMixConfig(weights=(1.0, 1.0))
    assert_raises_typed(ConfigError, mixture_lanes, [four, two], cfg, clause="MIX-22", what="lane counts differ",
                        mentions=["sources[1] has num_lanes=2 but sources[0] has 4"])
    assert_raises_typed(ConfigError, mixture_lanes, [four, wide], cfg, clause="MIX-22", what="seq_len differs",
                        mentions=["sources[1] packs seq_len=3"])
    assert_raises_typed(ConfigError, mixture_lanes, [wide], StreamMixConfig(weights=(1.0,)), clause="MIX-22",
                        what="no streaming source", mentions=["MIX-13"])


@pytest.mark.clause("MIX-23")
@given(mix=mixtures(), epoch=st.integers(0, 2))
def test_each_lane_is_the_weighted_draw_over_its_sources_lanes_by_the_stopping_rule(mix, epoch):
    sources, config = mix
    n = mixture_lanes(sources, config)
    rows = [r for b in StreamMixReferenceLoader(sources, config, num_workers=0) for r in b]
    if epoch:
        loader = StreamMixReferenceLoader(sources, config)
        loader.set_epoch(epoch)
        rows = [r for b in loader for r in b]
    for lane in range(n):
        expected, lanes = oracle_lane(sources, config, epoch, lane)
        got = [(r.source, r.sample) for r in rows if r.lane == lane]
        assert_equal(got, expected, clause="MIX-23", what=f"lane {lane}'s (source, sample) stream",
                     repro={"config": config, "epoch": epoch})
        if config.stopping == "all_exhausted":
            for i, samples in enumerate(lanes):
                assert_equal([r.source_index for r in rows if r.lane == lane and r.source == i],
                             list(range(lane, lane + n * len(samples), n)) if isinstance(sources[i], StoreSource)
                             else list(range(len(samples))), clause="MIX-23",
                             what=f"source {i}'s indices in lane {lane}: each lane sample once, in order")


@pytest.mark.clause("MIX-23")
def test_the_clause_example_interleaves_by_seed_and_first_exhausted_stops_at_the_empty_draw():
    p = PackingConfig(seq_len=2)
    store = StoreSource(corpus=[[[1, 2, 3]] * 4], config=PipelineConfig(packing=p))
    text = StreamSource(files=[RowFile(path="t", groups=(("a a a",) * 3,))], config=StreamingConfig(packing=p),
                        tokenizer=lambda s: [ord(c) for c in s.split()], tokenizer_id="ord")
    lanes = {(stop, seed): mixed_lane([store, text], StreamMixConfig(weights=(1.0, 1.0), stopping=stop, seed=seed),
                                      0, 0) for stop in ("first_exhausted", "all_exhausted") for seed in (0, 1)}
    assert_equal(lanes[("all_exhausted", 1)], [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (0, 4)],
                 clause="MIX-23", what="seed 1's lane")
    check(lanes[("all_exhausted", 0)] != lanes[("all_exhausted", 1)], clause="MIX-23",
          what="another seed gives the same interleaving")
    assert_equal(lanes[("first_exhausted", 1)], lanes[("all_exhausted", 1)][:-1], clause="MIX-23",
                 what="first_exhausted stops at the draw of the spent stream")
    assert_raises_typed(ConfigError, StreamMixConfig, weights=(1.0,), stopping="all_exhausted_oversample",
                        clause="MIX-23", what="oversample", mentions=["first_exhausted", "all_exhausted"])


@pytest.mark.clause("MIX-24")
@given(mix=mixtures(), batch=st.integers(1, 2), data=st.data())
def test_resuming_at_every_step_twice_continues_the_uninterrupted_run(mix, batch, data):
    sources, config = mix
    n = mixture_lanes(sources, config)
    world = data.draw(st.sampled_from([w for w in (1, 2) if n % w == 0]))

    def loaders():
        return [StreamMixReferenceLoader(sources, config, world_size=world, rank=r, batch_size=batch)
                for r in range(world)]

    full = [key(epochs(lo, 2)) for lo in loaders()]
    steps = len(full[0])
    check(all(len(f) == steps for f in full), clause="MIX-24", what="ranks took different numbers of steps")
    for k in range(sum(b[0][0] == 0 for b in full[0]) + 1):     # every step of epoch 0, and its end
        first = loaders()
        for lo in first:
            run(lo, k)
        state = json.loads(json.dumps(merge_states([lo.state_dict() for lo in first])))
        second = loaders()
        for lo in second:
            lo.load_state_dict(state)
        for lo in second:
            run(lo, 1)
        again = json.loads(json.dumps(merge_states([lo.state_dict() for lo in second])))
        third = loaders()
        for r, lo in enumerate(third):
            lo.load_state_dict(again)
            assert_equal(key(run(lo, steps - k - 1)), full[r][k + 1:], clause="MIX-24",
                         what=f"rank {r} resumed after step {k} and again after one more", repro={"config": config})


@pytest.mark.clause("MIX-24")
@given(mix=mixtures(lanes=2), steps=st.integers(0, 3))
def test_a_checkpoint_of_two_ranks_resumes_on_one_with_every_lane_continuing_its_stream(mix, steps):
    sources, config = mix
    ranks = [StreamMixReferenceLoader(sources, config, world_size=2, rank=r) for r in range(2)]
    total = len(epochs(StreamMixReferenceLoader(sources, config, world_size=2, rank=0), 1))
    before = [r for lo in ranks for b in take(lo, min(steps, total)) for r in b]
    one = StreamMixReferenceLoader(sources, config)
    one.load_state_dict(merge_states([lo.state_dict() for lo in ranks]))
    after = [r for b in one for r in b]
    for lane in range(2):
        stream = [(s, i) for s, i in mixed_lane(sources, config, 0, lane)]
        got = [(r.source, r.source_index) for r in before + after if r.lane == lane]
        assert_equal(got, stream[:len(got)], clause="MIX-24", what=f"lane {lane} across the resume")
        if config.stopping == "all_exhausted":   # one rank keeps every sample: nothing repeated, nothing skipped
            assert_exactly_once(got, stream, clause="MIX-24", what=f"lane {lane}'s samples")


@pytest.mark.clause("MIX-24")
def test_the_state_names_positions_per_source_and_a_foreign_one_is_refused_naming_the_part():
    p = PackingConfig(seq_len=2)
    store = StoreSource(corpus=[[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], config=PipelineConfig(packing=p))
    text = StreamSource(files=[RowFile(path="t", groups=(("a a a", "b b b"),))],
                        config=StreamingConfig(packing=p, num_lanes=2),
                        tokenizer=lambda s: [ord(c) for c in s.split()], tokenizer_id="ord")
    cfg = StreamMixConfig(weights=(1.0, 1.0), stopping="all_exhausted")
    loader = StreamMixReferenceLoader([store, text], cfg)
    rows = [[(r.lane, r.source, r.source_index) for r in b] for b in StreamMixReferenceLoader([store, text], cfg)]
    assert_equal(rows, [[(0, 1, 0)], [(1, 0, 1)], [(0, 1, 1)], [(1, 0, 3)], [(0, 0, 0)], [(0, 0, 2)]],
                 clause="MIX-24", what="the clause example's batches")
    run(loader, 1)
    state = loader.state_dict()
    lane0 = state["lanes"]["0"]
    assert_equal((lane0["attempts"], lane0["exhausted"], lane0["samples"], lane0["sources"][0]),
                 (1, [False, False], 1, 0), clause="MIX-24", what="lane 0 after one sample")
    assert_equal({k: lane0["sources"][1][k] for k in ("unit", "row", "offset", "current")},
                 {"unit": 0, "row": 1, "offset": 2, "current": [0, 0]}, clause="MIX-24", what="the stream's entry")
    for other, part in ((StreamMixConfig(weights=(1.0, 2.0), stopping="all_exhausted"), "weights"),
                        (StreamMixConfig(weights=(1.0, 1.0), stopping="all_exhausted", seed=3), "seed")):
        assert_raises_typed(StateError, StreamMixReferenceLoader([store, text], other).load_state_dict, state,
                            clause="MIX-24", what=f"a state of other {part}", mentions=[part])
    assert_raises_typed(StateError, StreamMixReferenceLoader([text, store], cfg).load_state_dict, state,
                        clause="MIX-24", what="the sources swapped", mentions=["sources[0]", "sources[1]"])
    half = StreamMixReferenceLoader([store, text], cfg, world_size=2, rank=0).state_dict()
    assert_raises_typed(StateError, loader.load_state_dict, half, clause="MIX-24", what="a rank's state alone",
                        mentions=["merge_states"])
    assert_raises_typed(TopologyError, StreamMixReferenceLoader, [store, text], cfg, world_size=3,
                        clause="MIX-24", what="3 ranks over 2 lanes", mentions=["choose world_size in [1, 2]"])


@pytest.mark.clause("MIX-25")
@pytest.mark.parametrize(("option", "mentions"), [
    ({"batching_method": "stratified"}, ["batching_method='random'", "MixedDataset"]),
    ({"batching_method": "per_stream"}, ["batching_method='random'"]),
    ({"weight_fn": len}, ["weights=[...]"]),
    ({"streams": ()}, ["streams=()", "weights=[...]"]),
    ({"epoch_size": 10}, ["epoch_size=10"]),
    ({"global_batch_size": 8}, ["global_batch_size=8"]),
    ({"end": "pad"}, ["end='drop_last'"]),
])
def test_options_of_a_planned_mixture_are_refused_naming_the_fix(option, mentions):
    assert_raises_typed(ConfigError, planned_options_refused, **option, clause="MIX-25", what=f"{option}",
                        mentions=mentions)
    planned_options_refused()


@pytest.mark.clause("MIX-25")
def test_missing_or_zero_weights_are_refused_naming_the_source():
    assert_raises_typed(ConfigError, StreamMixConfig, weights=None, clause="MIX-25", what="weights=None",
                        mentions=["equal weights"])
    assert_raises_typed(ConfigError, StreamMixConfig, weights=(1.0, 0.0), clause="MIX-25", what="a zero weight",
                        mentions=["weights[1]=0.0", "drop it"])


@pytest.mark.clause("STREAM-22", "MIX-24")
@given(mix=mixtures(lanes=4), batch=st.integers(1, 2), ahead=st.integers(0, 1), cross=st.booleans(), data=st.data())
def test_a_rank_a_batch_ahead_at_a_mixture_checkpoint_resumes_each_rank_to_the_epochs_steps(
        mix, batch, ahead, cross, data):
    sources, config = mix

    def make(rank):
        return StreamMixReferenceLoader(sources, config, world_size=2, rank=rank, batch_size=batch)

    whole = [[list(ld), list(ld)] for ld in (make(r) for r in range(2))]
    k = data.draw(st.integers(0, max(0, len(whole[0][0]) - 1)))
    loaders, taken = [make(r) for r in range(2)], []
    for r, ld in enumerate(loaders):
        it = iter(ld)
        got = list(itertools.islice(it, k + (r == ahead)))
        if r == ahead and cross:
            got += list(it)
        taken.append(len(got))
    merged = merge_states([json.loads(json.dumps(ld.state_dict())) for ld in loaders])
    for r in range(2):
        resumed = make(r)
        resumed.load_state_dict(merged)
        assert_equal([list(resumed), list(resumed)], [whole[r][0][taken[r]:], whole[r][1]], clause="STREAM-22",
                     what=f"mixture rank {r} resumed where it had taken {taken[r]} steps (rank {ahead} one ahead)")
