"""impl.streaming over fsspec URLs through impl.remote.RemoteFiles and a node-local cache (the file seam)."""

from __future__ import annotations

import pytest

from conformance.impl_tests.streaming_corpus import impl_rows, take, tokenizer, write
from impl.errors import ConfigError, SourceError
from impl.remote import RemoteFiles
from impl.streaming import StreamingDataset

ROWS = [f"row {i} " + "word " * (i % 4) for i in range(24)]
FIELDS = slice(3, None)      # the samples' contents: input_ids, labels, position_ids, doc_ids, token_offsets


def _ds(paths, **kw):
    return StreamingDataset(paths, tokenizer=tokenizer()[0], **{"seq_len": 4, "num_lanes": 2, "shuffle": True,
                                                                  "unit_bytes": 64, **kw})


def _contents(batches):
    return [[row[FIELDS] for row in batch] for batch in impl_rows(batches)]


def test_a_file_url_glob_streams_the_local_files_samples_through_the_cache_and_resumes(tmp_path):
    names, _ = write(tmp_path / "data", [("jsonl", [ROWS[:12]]), ("parquet", [ROWS[12:18], ROWS[18:]])])
    url = f"file://{tmp_path / 'data'}/f0*"
    remote = _ds(url, local=tmp_path / "cache")
    assert isinstance(remote.files, RemoteFiles)
    assert [f[0] for f in remote.index.files] == ["f00.jsonl", "f01.parquet"]
    full = _contents(remote)
    assert full == _contents(_ds(names)) and len(full) > 3
    assert remote.files.downloads == 2 and sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_file())
    first = _ds(url, local=tmp_path / "cache")
    take(first, 2)
    again = _ds([f"file://{tmp_path / 'data'}/f00.jsonl", f"file://{tmp_path / 'data'}/f01.parquet"],
                local=tmp_path / "cache2")
    again.load_state_dict(first.state_dict())
    assert _contents(again) == full[2:]


def test_a_url_without_local_a_glob_matching_nothing_and_mixed_paths_are_refused(tmp_path):
    names, _ = write(tmp_path / "data", [("txt", [ROWS])])
    with pytest.raises(ConfigError, match=r"paths are URLs under file://.*: pass local=<a node-local cache"):
        _ds(f"file://{tmp_path}/data/*.txt")
    with pytest.raises(SourceError, match=r"the glob 'file://.*/data/\*\.jsonl' matches no file"):
        _ds(f"file://{tmp_path}/data/*.jsonl", local=tmp_path / "cache")
    with pytest.raises(SourceError, match="paths mixes URLs and local paths"):
        _ds([names[0], f"file://{tmp_path}/data/f00.txt"], local=tmp_path / "cache")
    with pytest.raises(ConfigError, match="local, cache_limit and storage_options are for URL paths"):
        _ds(names, local=tmp_path / "cache")


def test_an_s3_source_streams_the_same_samples_as_its_local_copy(tmp_path):
    from conformance.impl_tests.remote_servers import S3Server, s3_options

    names, _ = write(tmp_path / "data", [("jsonl", [ROWS[:12]]), ("txt", [ROWS[12:]])])
    with S3Server() as server:
        server.upload_dir(tmp_path / "data", "bucket", "data")
        remote = StreamingDataset("s3://bucket/data/*", tokenizer=tokenizer()[0], seq_len=4, num_lanes=2,
                                  local=tmp_path / "cache", storage_options=s3_options(server.url))
        assert _contents(remote) == _contents(_ds(names, shuffle=False, unit_bytes=1 << 20))
