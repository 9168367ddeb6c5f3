"""A build task keeps its tokenizer busy: it reads and writes files while the tokenizer encodes, same store.

Why: a task that reads file f + 1, encodes it and writes it in turn leaves
the tokenizer idle while it reads each file and while it writes, fsyncs and
hashes each token file; on a machine whose cores the tokenizer fills, that
idle time is the gap between the build's rate and the tokenizer's (issue
20). The tests hold one step until the step that should overlap it has
started (each wait is bounded), so they check the order of events, not
timings; the identity tests of :mod:`test_build_tasks` check the bytes.
"""

from __future__ import annotations

import threading

import pytest

from conformance.impl_tests.test_build_tasks import OPTS, published, run_tasks, source, tok_dir  # noqa: F401
from impl import build_files, build_tasks, encoding
from impl.build_tasks import commit_build

WAIT_S = 20.0
"""Longest a held step waits for the step it should overlap (on the old, serial code it waits this long, then fails)."""


class _Watched:
    """A tokenizer that records each batch it encodes and, on batch ``hold``, waits for ``until`` first."""

    def __init__(self, tok, hold: int | None = None, until: threading.Event | None = None) -> None:
        self.tok, self.hold, self.until = tok, hold, until
        self.calls = 0
        self.second = threading.Event()
        self.waited: list[bool] = []

    def encode_batch_fast(self, texts, add_special_tokens):
        self.calls += 1
        if self.calls == 2:
            self.second.set()
        if self.calls == self.hold and self.until is not None:
            self.waited.append(self.until.wait(WAIT_S))
        return self.tok.encode_batch(texts, add_special_tokens=add_special_tokens)


def _watch(monkeypatch, **kwargs) -> list[_Watched]:
    made: list[_Watched] = []
    real = encoding.parsed_tokenizer

    def parsed(tok_json):
        made.append(_Watched(real(tok_json), **kwargs))
        return made[-1]

    monkeypatch.setattr(encoding, "parsed_tokenizer", parsed)
    return made


def test_a_task_encodes_its_next_file_while_its_last_one_is_written(source, tok_dir, tmp_path,   # noqa: F811
                                                                     monkeypatch):
    made = _watch(monkeypatch)
    real = build_files.write_token_file
    overlapped: list[bool] = []

    def write(path, values, offsets):
        if path.endswith("tokens-00000.arrow"):   # file 0 is one batch: its write waits for file 1's batch
            overlapped.append(made[0].second.wait(WAIT_S))
        real(path, values, offsets)

    monkeypatch.setattr(build_files, "write_token_file", write)
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 1)
    assert overlapped == [True]
    monkeypatch.undo()
    other = tmp_path / "other"
    run_tasks(source, tok_dir, other, 2)
    assert published(commit_build(out).path) == published(commit_build(other).path)


def test_a_task_reads_its_next_file_while_the_tokenizer_encodes_the_last_batch_of_this_one(
        source, tok_dir, tmp_path, monkeypatch):   # noqa: F811
    read_next = threading.Event()
    made = _watch(monkeypatch, hold=1, until=read_next)
    real = build_tasks.owned_files

    def owned(plan, index, count):
        seen, files = real(plan, index, count)

        def watched():
            for k, item in enumerate(files):
                if k == 1:
                    read_next.set()   # file 1's texts are read
                yield item

        return seen, watched()

    monkeypatch.setattr(build_tasks, "owned_files", owned)
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 1)
    assert made[0].waited == [True]
    assert commit_build(out).num_documents == 23


@pytest.mark.parametrize("batch_size", [1, 2, 3, 1000])
def test_ranges_encoded_as_one_stream_equal_each_range_encoded_alone(tok_dir, batch_size):   # noqa: F811
    from conformance.impl_tests.test_store import make_docs

    tok_json, info = encoding.resolve_tokenizer(tok_dir)
    enc = encoding.Encoder(tok_json, dtype="uint16", bos_id=None, eos_id=info.eos_id, batch_size=batch_size)
    docs = make_docs(17, seed=3)
    ranges = [("a", docs[:5]), ("b", []), ("c", docs[5:6]), ("d", docs[6:])]
    streamed = list(enc.encode_ranges(ranges))
    assert [key for key, *_ in streamed] == ["a", "b", "c", "d"]
    for (_, values, offsets, num_empty), (_, texts) in zip(streamed, ranges, strict=True):
        alone = enc.encode(texts)
        assert (values.tolist(), offsets.tolist(), num_empty) == (alone[0].tolist(), alone[1].tolist(), alone[2])


def test_an_in_process_build_encodes_its_next_file_while_its_last_one_is_written(source, tok_dir, tmp_path,  # noqa: F811
                                                                                 monkeypatch):
    from impl.store import TokenStore

    made = _watch(monkeypatch)
    real = build_files.write_token_file
    overlapped: list[bool] = []

    def write(path, values, offsets):
        if path.endswith("tokens-00000.arrow"):
            overlapped.append(made[0].second.wait(WAIT_S))
        real(path, values, offsets)

    monkeypatch.setattr(build_files, "write_token_file", write)
    store = TokenStore.build(source, tok_dir, tmp_path / "store", num_proc=1, progress=False, **OPTS)
    assert overlapped == [True]
    monkeypatch.undo()
    out = tmp_path / "tasks"
    run_tasks(source, tok_dir, out, 2)
    assert published(commit_build(out).path) == published(store.path)
