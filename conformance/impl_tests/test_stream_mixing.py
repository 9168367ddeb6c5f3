"""impl.stream_mixing against reference.stream_mixing, bit for bit: mixtures of streaming sources and stores (MIX-22..MIX-25)."""

from __future__ import annotations

import itertools
import json
import multiprocessing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.adapters.impl import build_store
from conformance.impl_tests.streaming_corpus import FIELDS, file_specs, take, tokenizer, write
from impl.dataset import PackedDataset
from impl.errors import ConfigError, StateError, TopologyError
from impl.loader import build_dataloader
from impl.mixed_dataset import MixedDataset
from impl.stream_mixing import StreamMixture
from impl.streaming import StreamingDataset, merge_states
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig
from reference.stream_mixing import StoreSource, StreamMixConfig, StreamMixReferenceLoader, StreamSource

_counter = itertools.count()


@st.composite
def mixtures(draw, *, lanes=None, stopping=None):
    """Options of a mixture: stream file specs (1 or 2 streams), store corpora (0 to 2), configs and weights."""
    num_lanes = draw(st.sampled_from([1, 2, 4])) if lanes is None else lanes
    streams = [draw(file_specs(max_files=2)) for _ in range(draw(st.integers(1, 2)))]
    docs = st.lists(st.integers(1, 9), max_size=8)
    stores = [[[draw(st.lists(st.integers(1, 9), min_size=6, max_size=8)), *draw(st.lists(docs, max_size=3))],
               *draw(st.lists(st.lists(docs, max_size=3), max_size=1))]     # a store always packs a sample
              for _ in range(draw(st.integers(0, 2)))]
    k = len(streams) + len(stores)
    return dict(streams=streams, stores=stores, num_lanes=num_lanes, seq_len=draw(st.integers(1, 4)),
                mode=draw(st.sampled_from(["concat", "chunk"])), seed=draw(st.integers(0, 3)),
                shuffle=draw(st.booleans()), buffer=draw(st.integers(0, 3)), unit_bytes=draw(st.integers(1, 30)),
                store_mode=draw(st.sampled_from(["concat", "chunk", "greedy"])), store_shuffle=draw(st.booleans()),
                weights=tuple(draw(st.lists(st.sampled_from([0.5, 1.0, 3.0]), min_size=k, max_size=k))),
                order=draw(st.permutations(range(k))),
                stopping=draw(st.sampled_from(["first_exhausted", "all_exhausted"])) if stopping is None else stopping,
                mix_seed=draw(st.integers(0, 2**32)))


def _build(tmp_path, m):
    """The impl sources (in ``m["order"]``) and the reference's view of each."""
    path, tok, tok_id = tokenizer()
    root = tmp_path / f"m{next(_counter)}"
    impl_sources, ref_sources = [], []
    pad = None
    for j, specs in enumerate(m["streams"]):
        names, ref_files = write(root / f"s{j}", specs)
        ds = StreamingDataset(names, tokenizer=path, seq_len=m["seq_len"], packing=m["mode"],
                              num_lanes=m["num_lanes"], seed=m["seed"] + j, shuffle=m["shuffle"],
                              shuffle_buffer_size=m["buffer"], unit_bytes=m["unit_bytes"], rank=0, world_size=1)
        pad = ds.config.packing.pad_id
        impl_sources.append(ds)
        ref_sources.append(StreamSource(files=ref_files, config=ds.config, tokenizer=tok, tokenizer_id=tok_id))
    packing = PackingConfig(seq_len=m["seq_len"], mode=m["store_mode"], pad_id=pad)
    for j, corpus in enumerate(m["stores"]):
        ordering = OrderingConfig(kind="global", seed=j) if m["store_shuffle"] else OrderingConfig()
        config = PipelineConfig(packing=packing, ordering=ordering)
        ds = PackedDataset.from_config(build_store(corpus, tmp_path), config, cache_dir=False)
        impl_sources.append(ds)
        ref_sources.append(StoreSource(corpus=corpus, config=config, fingerprint=ds.fingerprint))
    return [impl_sources[i] for i in m["order"]], [ref_sources[i] for i in m["order"]]


def _pair(tmp_path, m, *, world=1, rank=0, batch=1, built=None):
    impl_sources, ref_sources = built if built is not None else _build(tmp_path, m)
    mixed = MixedDataset(impl_sources, weights=m["weights"], stopping=m["stopping"], seed=m["mix_seed"],
                         allow_repeat=True)
    mixed.batch_size = batch
    mixed.set_topology(rank, world, 0)
    ref = StreamMixReferenceLoader(ref_sources, StreamMixConfig(weights=m["weights"], stopping=m["stopping"],
                                                                seed=m["mix_seed"]),
                                   world_size=world, rank=rank, batch_size=batch)
    return mixed, ref


def impl_rows(batches):
    return [[(int(b["epoch"][j]), int(b["lane"][j]), int(b["sample_index"][j]), int(b["source"][j]),
              int(b["source_index"][j]), *(tuple(b[f][j].tolist()) for f in FIELDS)) for j in range(len(b["lane"]))]
            for b in batches]


def ref_rows(batches):
    return [[(r.epoch, r.lane, r.index, r.source, r.source_index, *(getattr(r.sample, f) for f in FIELDS))
             for r in b] for b in batches]


@pytest.mark.clause("MIX-22", "MIX-23", "MIX-24")
@given(m=mixtures(), batch=st.integers(1, 2), data=st.data())
def test_two_epochs_of_batches_equal_the_reference_s_on_every_rank(tmp_path, m, batch, data):
    world = data.draw(st.sampled_from([w for w in (1, 2, 4) if m["num_lanes"] % w == 0]))
    built = _build(tmp_path, m)
    for rank in range(world):
        mixed, ref = _pair(tmp_path, m, world=world, rank=rank, batch=batch, built=built)
        check = isinstance(mixed, StreamMixture)
        assert check, f"MixedDataset over a StreamingDataset gave {type(mixed).__name__}"
        for _ in range(2):
            assert impl_rows(mixed) == ref_rows(ref)
            assert mixed.epoch == ref.epoch


@pytest.mark.clause("MIX-24")
@given(m=mixtures(), batch=st.integers(1, 2))
def test_a_state_equals_the_reference_s_and_resuming_at_every_step_twice_continues_the_run(tmp_path, m, batch):
    built = _build(tmp_path, m)
    mixed, _ = _pair(tmp_path, m, batch=batch, built=built)
    whole = impl_rows(mixed) + impl_rows(mixed)      # two uninterrupted epochs
    first_epoch = sum(1 for b in whole if b[0][0] == 0)
    for k in range(first_epoch + 1):
        a, ref = _pair(tmp_path, m, batch=batch, built=built)
        assert impl_rows(take(iter(a), k)) == ref_rows(take(iter(ref), k))
        state = a.state_dict()
        assert state == ref.state_dict()
        b, _ = _pair(tmp_path, m, batch=batch, built=built)
        b.load_state_dict(json.loads(json.dumps(state)))
        got = impl_rows(take(iter(b), 1))
        if not got:    # the epoch had ended: the next pass starts epoch 1
            got = impl_rows(take(iter(b), 1))
        c, _ = _pair(tmp_path, m, batch=batch, built=built)
        c.load_state_dict(b.state_dict())
        while c.epoch < 2:
            got += impl_rows(c)
        assert got == whole[k:], f"resumed after step {k}, then after one more"


@pytest.mark.clause("MIX-24")
@given(m=mixtures(lanes=4), steps=st.integers(0, 3), target=st.sampled_from([1, 2, 4]))
def test_a_merged_checkpoint_of_two_ranks_resumes_on_another_world_size_as_the_reference_does(
        tmp_path, m, steps, target):
    built = _build(tmp_path, m)
    states = []
    for rank in (0, 1):
        mixed, _ = _pair(tmp_path, m, world=2, rank=rank, built=built)
        take(iter(mixed), steps)
        states.append(mixed.state_dict())
    merged = merge_states(states)
    for rank in range(target):
        mixed, ref = _pair(tmp_path, m, world=target, rank=rank, built=built)
        mixed.load_state_dict(merged)
        ref.load_state_dict(merged)
        assert impl_rows(mixed) == ref_rows(ref)


@pytest.mark.clause("MIX-23")
@given(m=mixtures(stopping="all_exhausted"))
def test_under_all_exhausted_one_rank_trains_every_sample_of_every_source_exactly_once(tmp_path, m):
    built = _build(tmp_path, m)
    impl_sources = built[0]
    mixed, _ = _pair(tmp_path, m, built=built)
    rows = [r for b in impl_rows(mixed) for r in b]
    for i, source in enumerate(impl_sources):
        got = sorted((r[1] if isinstance(source, StreamingDataset) else 0, r[4], *r[5:]) for r in rows if r[3] == i)
        if isinstance(source, StreamingDataset):
            alone = list(source)      # the stream's batches by itself, one rank: every lane sample
            want = sorted((int(b["lane"][j]), int(b["sample_index"][j]), *(tuple(b[f][j].tolist()) for f in FIELDS))
                          for b in alone for j in range(len(b["lane"])))
        else:
            n = source.num_samples(0)
            batch = source.samples(0, list(range(n)))
            want = sorted((0, j, *(tuple(batch[f][j].tolist()) for f in FIELDS)) for j in range(n))
        assert got == want, f"source {i}: every sample once, nothing else"


def test_dataloader_workers_hand_out_the_in_process_batches_and_state(tmp_path):
    m = dict(streams=[[("jsonl", [["a b c", "d e", "f", "g h i j", "k"]]), ("txt", [["l m", "n o p", "q"]])]],
             stores=[[[[1, 2, 3, 4, 5], [6, 7, 8]], [[9, 10, 11, 12]]]], num_lanes=4, seq_len=2, mode="concat",
             seed=1, shuffle=True, buffer=2, unit_bytes=8, store_mode="concat", store_shuffle=True,
             weights=(1.0, 2.0), order=[0, 1], stopping="all_exhausted", mix_seed=5)
    built = _build(tmp_path, m)
    ref = StreamMixReferenceLoader(built[1], StreamMixConfig(weights=m["weights"], stopping=m["stopping"],
                                                             seed=m["mix_seed"]), num_workers=2, batch_size=2)
    expected = ref_rows(ref)                        # STREAM-11 with two workers: each batch one worker's lanes
    assert len(expected) >= 2, "the fixture yields batches"
    spawn = multiprocessing.get_context("spawn")
    mixed, _ = _pair(tmp_path, m, built=built)
    loader = build_dataloader(mixed, batch_size=2, num_workers=2, multiprocessing_context=spawn)
    it = iter(loader)
    got = impl_rows([next(it)])
    state = loader.state_dict()
    got += impl_rows(it)
    assert got == expected
    resumed, _ = _pair(tmp_path, m, built=built)
    loader = build_dataloader(resumed, batch_size=2, num_workers=2, multiprocessing_context=spawn)
    loader.load_state_dict(state)
    assert impl_rows(loader) == expected[1:]


def _sources(tmp_path, lanes=(2,)):
    path, _, _ = tokenizer()
    out = []
    for j, n in enumerate(lanes):
        names, _ = write(tmp_path / f"x{next(_counter)}", [("jsonl", [[f"row {j} {i}" for i in range(6)]])])
        out.append(StreamingDataset(names, tokenizer=path, seq_len=2, num_lanes=n, rank=0, world_size=1))
    store = PackedDataset.from_config(build_store([[[1, 2, 3, 4, 5]]], tmp_path),
                                      PipelineConfig(packing=PackingConfig(seq_len=2, pad_id=out[0].config.packing.pad_id)),
                                      cache_dir=False)
    return out, store


@pytest.mark.clause("MIX-25")
@pytest.mark.parametrize(("options", "mentions"), [
    ({"weights": None}, ["equal weights"]),
    ({"weights": (1.0, 0.0)}, ["weights[1]=0.0"]),
    ({"weights": (1.0, 1.0), "weight_fn": len}, ["weights=[...]"]),
    ({"weights": (1.0, 1.0), "batching_method": "stratified"}, ["batching_method='random'", "MixedDataset"]),
    ({"weights": (1.0, 1.0), "end": "pad"}, ["end='drop_last'"]),
    ({"weights": (1.0, 1.0), "epoch_size": 8}, ["epoch_size=8"]),
    ({"weights": (1.0, 1.0), "cache_dir": False}, ["cache_dir"]),
    ({"weights": (1.0, 1.0), "stopping": "all_exhausted_oversample"}, ["first_exhausted", "all_exhausted"]),
])
def test_options_a_lane_mixture_cannot_honour_are_refused_naming_the_fix(tmp_path, options, mentions):
    (stream,), store = _sources(tmp_path)
    with pytest.raises(ConfigError) as info:
        MixedDataset([stream, store], **options)
    for text in mentions:
        assert text in str(info.value)


@pytest.mark.clause("MIX-22", "MIX-24")
def test_mismatched_sources_topologies_and_foreign_states_are_refused_by_name(tmp_path):
    (a, b), store = _sources(tmp_path, lanes=(2, 4))
    with pytest.raises(ConfigError, match=r"sources\[1\] has num_lanes=4 but sources\[0\] has 2"):
        MixedDataset([a, b], weights=(1, 1))
    with pytest.raises(ConfigError, match="same source"):
        MixedDataset([a, a], weights=(1, 1))
    with pytest.raises(ConfigError, match="MIX-13"):
        StreamMixture([store], weights=(1,))
    mixed = MixedDataset([a, store], weights=(1, 1))
    with pytest.raises(TopologyError, match=r"choose world_size in \[1, 2\]"):
        build_dataloader(mixed, batch_size=1, rank=0, world_size=3)
    with pytest.raises(ConfigError, match="replication"):
        build_dataloader(mixed, batch_size=1, replication=2, rank=0, world_size=2)
    state = mixed.state_dict()
    for other, part in ((MixedDataset([a, store], weights=(1, 2)), "weights"),
                        (MixedDataset([store, a], weights=(1, 1)), "sources[0]"),
                        (MixedDataset([a, store], weights=(1, 1), seed=7), "seed")):
        with pytest.raises(StateError, match=part.replace("[", r"\[").replace("]", r"\]")):
            other.load_state_dict(state)
    with pytest.raises(StateError, match="merge_states"):
        MixedDataset([a, store], weights=(1, 1)).load_state_dict(dict(state, lanes={"0": state["lanes"]["0"]}))


@pytest.mark.clause("STREAM-22", "MIX-24")
@given(m=mixtures(lanes=4), batch=st.integers(1, 2), ahead=st.integers(0, 1), cross=st.booleans(), data=st.data())
def test_a_rank_a_batch_ahead_at_a_mixture_checkpoint_resumes_each_rank_to_the_epochs_steps_as_the_reference(
        tmp_path, m, batch, ahead, cross, data):
    built = _build(tmp_path, m)
    whole = []
    for r in range(2):
        mixed, _ = _pair(tmp_path, m, world=2, rank=r, batch=batch, built=built)
        whole.append([impl_rows(mixed), impl_rows(mixed)])
    k = data.draw(st.integers(0, max(0, len(whole[0][0]) - 1)))
    pairs = [_pair(tmp_path, m, world=2, rank=r, batch=batch, built=built) for r in range(2)]
    taken = []
    for r, (mixed, ref) in enumerate(pairs):
        its = iter(mixed), iter(ref)
        n = k + (r == ahead)
        got, expected = impl_rows(take(its[0], n)), ref_rows(take(its[1], n))
        if r == ahead and cross:
            got, expected = got + impl_rows(list(its[0])), expected + ref_rows(list(its[1]))
        assert got == expected
        taken.append(len(got))
    states = [json.loads(json.dumps(mixed.state_dict())) for mixed, _ in pairs]
    assert states == [ref.state_dict() for _, ref in pairs]
    merged = merge_states(states)
    for r in range(2):
        mixed, ref = _pair(tmp_path, m, world=2, rank=r, batch=batch, built=built)
        mixed.load_state_dict(merged)
        ref.load_state_dict(merged)
        rest = [impl_rows(mixed), impl_rows(mixed)]
        assert rest == [ref_rows(ref), ref_rows(ref)]
        assert rest == [whole[r][0][taken[r]:], whole[r][1]], f"rank {r} resumed from {taken[r]} steps"
    if merged["ranks"]["0"]["epoch"] != merged["ranks"]["1"]["epoch"]:
        mixed, _ = _pair(tmp_path, m, world=1, rank=0, batch=batch, built=built)
        with pytest.raises(StateError, match="straddle two epochs"):
            mixed.load_state_dict(merged)
