"""Small streaming corpora written to disk twice over: as files for ``impl.streaming`` and as ``reference.units`` files.

Why one helper: every streaming test compares impl with the reference on
the same bytes, so the files, their etags (mtime in ns, what
``impl.files.LocalFiles`` reports) and the tokenizer's identity must agree.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from impl.encoding import resolve_tokenizer
from impl.repo_fixtures import generators
from reference.units import RowFile, TextFile

KINDS = ("txt", "jsonl", "jsonl.gz", "parquet", "arrow")
FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")
words = st.text(alphabet="ab cé", max_size=12)


@functools.cache
def tokenizer() -> tuple[Path, Any, str]:
    """The fixtures' GPT-2 tokenizer: its path, the reference's str -> ids function, and its identity."""
    from tokenizers import Tokenizer

    path = generators().tokenizer_path()
    tok_json, info = resolve_tokenizer(path)
    tok = Tokenizer.from_str(tok_json)
    return path, lambda text: tok.encode(text, add_special_tokens=False).ids, info.sha256


@st.composite
def file_specs(draw: Any, max_files: int = 3) -> list[tuple[str, list[list[str]]]]:
    """Files as ``(kind, groups of rows)``: text kinds hold one group; every file holds at least one row."""
    out = []
    for _ in range(draw(st.integers(1, max_files))):
        kind = draw(st.sampled_from(KINDS))
        if kind in ("parquet", "arrow"):
            groups = draw(st.lists(st.lists(words, min_size=1, max_size=4), min_size=1, max_size=3))
        else:
            groups = [draw(st.lists(words, min_size=1, max_size=8))]
        out.append((kind, groups))
    return out


def write(directory: Path, specs: list[tuple[str, list[list[str]]]]) -> tuple[list[str], list[Any]]:
    """Write the files; return their paths and the reference's view of them (same bytes, same etags)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    names, ref = [], []
    for i, (kind, groups) in enumerate(specs):
        path = directory / f"f{i:02d}.{kind}"
        if kind in ("parquet", "arrow"):
            schema = pa.schema([("text", pa.string()), ("n", pa.int64())])
            tables = [pa.table({"text": g, "n": list(range(len(g)))}, schema=schema) for g in groups]
            if kind == "parquet":
                with pq.ParquetWriter(path, schema) as w:
                    for t in tables:
                        w.write_table(t)
            else:
                with pa.ipc.new_file(path, schema) as w:
                    for t in tables:
                        w.write_batch(t.to_batches()[0] if t.num_rows else pa.record_batch([[], []], schema=schema))
        else:
            rows = groups[0]
            if kind == "txt":
                data = ("\n".join(rows) + "\n").encode()
            else:
                data = "".join(json.dumps({"text": r, "n": j}) + "\n" for j, r in enumerate(rows)).encode()
            path.write_bytes(gzip.compress(data, mtime=0) if kind.endswith(".gz") else data)
        st_ = os.stat(path)
        etag = str(st_.st_mtime_ns)
        if kind in ("parquet", "arrow"):
            ref.append(RowFile(path=str(path), groups=tuple(tuple(g) for g in groups), format=kind,  # type: ignore[arg-type]
                               size=st_.st_size, etag=etag))
        else:
            raw = gzip.decompress(path.read_bytes()) if kind.endswith(".gz") else path.read_bytes()
            ref.append(TextFile(path=str(path), data=raw, format=kind.split(".")[0],  # type: ignore[arg-type]
                                etag=etag, compressed=kind.endswith(".gz"), size=st_.st_size))
        names.append(str(path))
    return names, ref


def impl_rows(batches: Any) -> list[list[tuple[Any, ...]]]:
    """Batches of ``impl.streaming`` as ``(epoch, lane, index, fields...)`` rows."""
    out = []
    for b in batches:
        out.append([(int(b["epoch"][j]), int(b["lane"][j]), int(b["sample_index"][j]),
                     *(tuple(b[f][j].tolist()) for f in FIELDS)) for j in range(len(b["lane"]))])
    return out


def ref_rows(batches: Any) -> list[list[tuple[Any, ...]]]:
    """Batches of ``reference.streaming.StreamingReferenceLoader`` in ``impl_rows``'s layout."""
    return [[(r.epoch, r.lane, r.index, *(getattr(r.sample, f) for f in FIELDS)) for r in b] for b in batches]


def take(iterable: Any, n: int) -> list[Any]:
    """The first ``n`` items, leaving the iterator open (the state then counts exactly these)."""
    out = []
    it = iter(iterable)
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out
