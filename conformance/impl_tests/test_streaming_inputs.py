"""impl.streaming on real input: bad files refused by name, a foreign checkpoint refused, the index cache,
DataLoader workers, and the streaming epoch equal to a TokenStore's, a file behind a byte order mark too
(STREAM-2, 4, 5, 10, 11, 15, 16)."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os

import pytest

from conformance.impl_tests.streaming_corpus import impl_rows, ref_rows, take, tokenizer, write
from impl.errors import SourceError, StateError
from impl.loader import build_dataloader
from impl.streaming import StreamingDataset
from impl.units import build_unit_index
from reference.streaming import StreamingReferenceLoader

ROWS = [f"row {i} " + "word " * (i % 5) for i in range(30)]


def _ds(names, **kw):
    return StreamingDataset(names, tokenizer=kw.pop("tokenizer", tokenizer()[0]), **{"seq_len": 4, **kw})


def test_a_glob_matching_nothing_an_empty_file_and_a_parquet_without_the_column_are_refused_by_name(tmp_path):
    with pytest.raises(SourceError, match="matches no file"):
        _ds([str(tmp_path / "*.jsonl")])
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(SourceError, match=r"empty\.jsonl is empty .*leave it out of paths"):
        _ds([str(tmp_path / "empty.jsonl")])
    names, _ = write(tmp_path / "p", [("parquet", [["a", "b"]])])
    with pytest.raises(SourceError, match=r"f00\.parquet has no column 'body' .*pass text_field="):
        _ds(names, text_field="body")


def test_a_jsonl_line_without_the_text_field_is_refused_naming_the_file_and_the_byte(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    ds = _ds([str(path)], seq_len=1)
    with pytest.raises(SourceError, match=r"a\.jsonl: the line at byte 17 has no string field 'text'"):
        list(ds)


@pytest.mark.clause("STREAM-5")
def test_the_index_is_cached_atomically_and_read_back_without_rescanning(tmp_path, monkeypatch):
    from impl import units

    names, _ = write(tmp_path / "d", [("txt", [ROWS]), ("parquet", [ROWS[:3], ROWS[3:]])])
    first = build_unit_index(names, unit_bytes=16, index_dir=tmp_path / "idx")
    cached = [p for p in os.listdir(tmp_path / "idx") if p.endswith(".json")]
    assert len(cached) == 1 and not [p for p in os.listdir(tmp_path / "idx") if p.endswith(".tmp")]
    body = json.loads((tmp_path / "idx" / cached[0]).read_text())
    assert body["fingerprint"] == first.fingerprint

    def no_scan(*args, **kwargs):
        raise AssertionError("the cached index was rebuilt")

    monkeypatch.setattr(units, "_line_units", no_scan)
    monkeypatch.setattr(units, "_pyarrow_groups", no_scan)
    assert build_unit_index(names, unit_bytes=16, index_dir=tmp_path / "idx") == first


@pytest.mark.clause("STREAM-15")
def test_a_file_changed_between_checkpoint_and_resume_is_refused(tmp_path):
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS])])
    ds = _ds(names, num_lanes=2, unit_bytes=64)
    take(iter(ds), 2)
    state = ds.state_dict()
    with open(names[0], "a") as f:
        f.write(json.dumps({"text": "one more row"}) + "\n")
    with pytest.raises(StateError, match=r"differs from this loader in the unit index \(a file was changed"):
        _ds(names, num_lanes=2, unit_bytes=64).load_state_dict(state)


@pytest.mark.clause("STREAM-15")
def test_a_checkpoint_taken_with_another_tokenizer_is_refused(tmp_path):
    from tokenizers import Tokenizer

    names, _ = write(tmp_path / "d", [("jsonl", [ROWS])])
    other = Tokenizer.from_file(str(tokenizer()[0] / "tokenizer.json"))
    other.add_tokens(["<extra>"])
    ds = _ds(names, add_eos=False)
    take(iter(ds), 1)
    with pytest.raises(StateError, match=r"in the tokenizer \('[0-9a-f]{64}' in the checkpoint, '[0-9a-f]{64}' here\)"):
        _ds(names, add_eos=False, tokenizer=other).load_state_dict(ds.state_dict())


@pytest.mark.clause("STREAM-10", "STREAM-11", "STREAM-13")
def test_two_dataloader_workers_give_the_reference_s_batches_and_state(tmp_path):
    names, ref_files = write(tmp_path / "d", [("jsonl", [ROWS]), ("txt", [ROWS[::-1]])])
    _, tok, tok_id = tokenizer()
    kw = dict(seq_len=4, num_lanes=4, shuffle=True, shuffle_buffer_size=3, unit_bytes=48)
    ds = _ds(names, **kw)
    loader = build_dataloader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    ref = StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id, num_workers=2, batch_size=2)
    got, want = impl_rows(take(iter(loader), 3)), ref_rows(take(iter(ref), 3))
    assert got == want and {row[1] for batch in got for row in batch} == {0, 1, 2, 3}
    assert loader.state_dict() == ref.state_dict()
    resumed = build_dataloader(_ds(names, **kw), batch_size=2, num_workers=2, multiprocessing_context="fork")
    resumed.load_state_dict(loader.state_dict())
    assert impl_rows(resumed) == ref_rows(ref)


@pytest.mark.clause("STREAM-16")
def test_without_shuffle_one_lane_streams_the_token_store_s_epoch(tmp_path):
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    write(tmp_path / "src", [("jsonl", [ROWS[:12]]), ("parquet", [ROWS[12:20], ROWS[20:]])])
    store = TokenStore.build(tmp_path / "src", tokenizer()[0], tmp_path / "store", progress=False)
    packed = PackedDataset(store, seq_len=6, packing="concat")
    stream = [row for batch in impl_rows(_ds([str(tmp_path / "src" / "*")], seq_len=6, unit_bytes=40))
              for row in batch]
    assert len(stream) == len(packed) > 3
    for i, row in enumerate(stream):
        sample = packed[i]
        assert row[3:] == tuple(tuple(sample[f].tolist()) for f in
                                ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets"))


@pytest.mark.clause("STREAM-2", "STREAM-16")
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_file_behind_a_byte_order_mark_streams_as_its_token_store_does(tmp_path, kind):
    """A BOM at a file's first byte is not text: the first row streams as a TokenStore build reads it (utf-8-sig)."""
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    rows = ["first row here", *ROWS[:9]]
    body = ("\n".join(rows) + "\n" if kind == "txt" else "".join(json.dumps({"text": r}) + "\n" for r in rows))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / f"bom.{kind}").write_bytes(b"\xef\xbb\xbf" + body.encode())
    store = TokenStore.build(tmp_path / "src", tokenizer()[0], tmp_path / "store", progress=False)
    packed = PackedDataset(store, seq_len=5, packing="concat")
    stream = [row for batch in impl_rows(_ds([str(tmp_path / "src" / f"bom.{kind}")], seq_len=5, unit_bytes=40))
              for row in batch]
    assert len(stream) == len(packed) > 3
    for i, row in enumerate(stream):
        sample = packed[i]
        assert row[3:] == tuple(tuple(sample[f].tolist()) for f in
                                ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")), f"sample {i}"


def test_each_dataloader_worker_sizes_its_tokenizer_pool_to_its_share_of_the_cores(tmp_path, monkeypatch):
    """K workers each running a thread pool of every core oversubscribe the machine: each takes cores // K."""
    from impl import stream_tokens

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    original = stream_tokens.batch_encoder

    def recording(tok_json):
        encode = original(tok_json)
        (tmp_path / f"worker-{os.getpid()}").write_text(os.environ.get("RAYON_NUM_THREADS", "unset"))
        return encode

    monkeypatch.setattr(stream_tokens, "batch_encoder", recording)
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS])])
    loader = build_dataloader(_ds(names, num_lanes=2, unit_bytes=40), batch_size=2, num_workers=2,
                              multiprocessing_context="fork")
    assert len(list(loader)) > 2
    seen = {p.name: p.read_text() for p in tmp_path.glob("worker-*")}
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert len(seen) == 2 and set(seen.values()) == {share}, seen
    assert "RAYON_NUM_THREADS" not in os.environ


@pytest.mark.clause("STREAM-10", "STREAM-12")
def test_torch_s_own_dataloader_with_workers_yields_every_sample_of_the_reference_epoch(tmp_path):
    from torch.utils.data import DataLoader

    names, ref_files = write(tmp_path / "d", [("jsonl", [ROWS]), ("parquet", [ROWS[:9], ROWS[9:]])])
    _, tok, tok_id = tokenizer()
    ds = _ds(names, num_lanes=2, unit_bytes=40, batch_size=2)
    got = impl_rows(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    ref = StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id, num_workers=2, batch_size=2)
    assert sorted(got) == sorted(ref_rows(ref)) and len(got) > 2


@pytest.mark.clause("STREAM-11", "STREAM-12", "STREAM-14")
def test_each_of_two_ranks_with_two_workers_gives_the_reference_s_batches_and_their_states_merge(tmp_path):
    from impl.streaming import merge_states

    names, ref_files = write(tmp_path / "d", [("jsonl", [ROWS]), ("txt", [ROWS[::-1]])])
    _, tok, tok_id = tokenizer()
    kw = dict(seq_len=3, num_lanes=8, shuffle=True, unit_bytes=40)
    states = []
    for rank in (0, 1):
        ds = _ds(names, **kw)
        loader = build_dataloader(ds, batch_size=2, rank=rank, world_size=2, num_workers=2,
                                  multiprocessing_context="fork")
        ref = StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id, world_size=2, rank=rank,
                                       num_workers=2, batch_size=2)
        assert impl_rows(take(iter(loader), 3)) == ref_rows(take(iter(ref), 3))
        states.append(loader.state_dict())
        assert states[-1] == ref.state_dict()
    merged = merge_states(states)
    assert sorted(merged["lanes"], key=int) == [str(i) for i in range(8)]


@pytest.mark.clause("STREAM-15")
def test_a_resume_deep_into_an_epoch_reads_a_unit_or_two_not_everything_before_it(tmp_path):
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS * 3])])
    kw = dict(seq_len=4, unit_bytes=1)                 # one row per unit: 90 units
    ds = _ds(names, **kw)
    take(iter(ds), 60)
    assert ds.unit_reads > 40
    resumed = _ds(names, **kw)
    resumed.load_state_dict(ds.state_dict())
    take(iter(resumed), 1)
    assert resumed.unit_reads <= 3


@pytest.mark.clause("STREAM-6", "STREAM-7", "STREAM-8", "STREAM-9")
def test_a_shuffled_stream_changes_order_with_seed_and_epoch_and_trains_each_token_pair_at_most_once(tmp_path):
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS]), ("txt", [ROWS[::-1]])])
    kw = dict(seq_len=4, num_lanes=2, shuffle=True, shuffle_buffer_size=4, unit_bytes=40)

    def epochs(seed):
        ds = _ds(names, seed=seed, **kw)
        return [[row for batch in impl_rows(ds) for row in batch] for _ in range(2)]

    (e0, e1), (f0, _) = epochs(0), epochs(1)
    docs = [[tuple(r[6]) for r in e] for e in (e0, e1, f0)]
    assert docs[0] != docs[1] and docs[0] != docs[2]
    for epoch in (e0, e1):
        pairs = [(d, o) for r in epoch for d, o, label in zip(r[6], r[7], r[4], strict=True) if label != -100]
        assert len(pairs) == len(set(pairs)) > 0


@pytest.mark.clause("STREAM-15")
def test_a_file_removed_between_checkpoint_and_resume_is_refused_by_name(tmp_path):
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS]), ("txt", [ROWS])])
    ds = _ds(names)
    take(iter(ds), 1)
    os.remove(names[1])
    with pytest.raises(SourceError, match=r"f01\.txt does not exist"):
        _ds(names).load_state_dict(ds.state_dict())


DIRTY = (b'{"text": "good one"}\n{oops\n{"text": "two two"}\n\xff\xfe\n{"body": "x"}\n'
         + b"".join(json.dumps({"text": r}).encode() + b"\n" for r in ROWS[:12]))


def _dirty_ref(path):
    from reference.units import TextFile

    return [TextFile(path=str(path), data=path.read_bytes(), format="jsonl", etag=str(os.stat(path).st_mtime_ns))]


@pytest.mark.clause("STREAM-17")
@pytest.mark.filterwarnings("ignore::impl.streaming.SkippedRowsWarning")
@pytest.mark.parametrize("world_size", [1, 2])
def test_skip_drops_bad_lines_like_the_reference_counts_them_by_file_and_resumes_exactly(tmp_path, world_size):
    from impl.streaming import SkippedRowsWarning, merge_states

    path = tmp_path / "dirty.jsonl"
    path.write_bytes(DIRTY)
    kw = dict(seq_len=3, num_lanes=2, shuffle=True, shuffle_buffer_size=3, unit_bytes=40, on_error="skip", seed=5)
    with pytest.raises(SourceError, match=r"dirty\.jsonl: the line at byte \d+ (is not|has no)"):
        list(_ds([str(path)], **dict(kw, on_error="raise")))
    _, tok, tok_id = tokenizer()
    for rank in range(world_size):
        ds = _ds([str(path)], rank=rank, world_size=world_size, **kw)
        with pytest.warns(SkippedRowsWarning, match=r"dirty\.jsonl: skipped \d bad line\(s\) .*\(3 in this file so far"):
            got = impl_rows(ds)
        ref = StreamingReferenceLoader(_dirty_ref(path), ds.config, tok, tokenizer_id=tok_id, rank=rank,
                                       world_size=world_size)
        assert got == ref_rows(ref) and len(got) > 2
        assert ds.skipped == {str(path): 3}
    # a checkpoint past skipped lines resumes each lane where it stood, on one rank whatever world_size saved it
    first = [_ds([str(path)], rank=r, world_size=world_size, **kw) for r in range(world_size)]
    for ds in first:
        take(ds, 2)
    state = merge_states([ds.state_dict() for ds in first])
    whole = _ds([str(path)], **kw)
    rest = impl_rows(whole)
    again = _ds([str(path)], **kw)
    again.load_state_dict(state)
    resumed = [row for batch in impl_rows(again) for row in batch]
    assert sorted(resumed) == sorted(row for batch in rest for row in batch
                                     if row[2] >= state["lanes"][str(row[1])]["samples"])


@pytest.mark.clause("STREAM-17")
@pytest.mark.filterwarnings("ignore::impl.streaming.SkippedRowsWarning")
def test_with_dataloader_workers_the_training_process_counts_every_workers_skipped_lines(tmp_path):
    from impl.streaming import SKIPPED_KEY

    path = tmp_path / "dirty.jsonl"
    path.write_bytes(DIRTY)
    ds = _ds([str(path)], seq_len=3, num_lanes=2, unit_bytes=40, on_error="skip")
    batches = list(build_dataloader(ds, batch_size=1, num_workers=2, multiprocessing_context="fork"))
    assert len(batches) > 2 and not any(SKIPPED_KEY in b for b in batches)
    assert ds.skipped == {str(path): 3}


def test_on_error_must_be_raise_or_skip(tmp_path):
    from impl.errors import ConfigError

    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "fine"}\n')
    with pytest.raises(ConfigError, match=r"on_error='ignore' must be one of \('raise', 'skip'\)"):
        _ds([str(path)], on_error="ignore")


@pytest.mark.clause("STREAM-13")
def test_a_streaming_iterator_dropped_mid_epoch_stops_its_workers_at_once_and_close_keeps_the_lanes_state(tmp_path):
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS]), ("txt", [ROWS[::-1]])])
    loader = build_dataloader(_ds(names, num_lanes=4, unit_bytes=48), batch_size=2, num_workers=2,
                              multiprocessing_context="fork")
    before = {p.pid for p in multiprocessing.active_children()}
    gc.disable()   # a loader<->iterator cycle would leave the workers to the collector, at some later allocation
    try:
        it = iter(loader)
        next(it)
        workers = [p for p in multiprocessing.active_children() if p.pid not in before]
        del it
        alive = [p.pid for p in workers if p.is_alive()]
    finally:
        gc.enable()
    assert len(workers) == 2 and not alive, f"workers {workers}: {alive} still run after their iterator was dropped"
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.close()
    assert list(it) == [] and loader.state_dict() == state
