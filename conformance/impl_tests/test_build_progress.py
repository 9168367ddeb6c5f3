"""A build's progress bar has a total, a rate and an ETA, for directories of JSON Lines / txt and for the HF path.

Why bytes for directories: a JSON Lines or txt file's document count is
known only once it is read, but the sum of the file sizes is a stat per file,
so the bar counts bytes of the source's files against that sum. The HF path
knows its row count (``len`` of the split) and counts documents.
"""

from __future__ import annotations

import gzip
import io
import re

import datasets
import pytest
from tqdm import tqdm

from fixtures import generators
from impl import cli
from impl.hf import tokenize_split
from impl.store import TokenStore

BAR = re.compile(r"tokenizing: +(\d+)%\|[^|]*\| *([\d.]+[kMG]?)/([\d.]+[kMG]?) \[[\d:]+<[\d:?]+, *[\d.]+ ?([kMG]?)(\w+)/s\]")


def _final_bar(err: str) -> re.Match[str]:
    """The last complete bar line tqdm wrote (it separates updates by carriage returns)."""
    lines = [m for m in (BAR.search(part) for part in re.split(r"[\r\n]", err)) if m]
    assert lines, f"no progress bar with a total, a rate and an ETA in stderr {err[-600:]!r}"
    return lines[-1]


def _source_dir(tmp_path):
    texts = generators.load_corpus(limit=12)
    generators.write_jsonl_shards(texts[:8], tmp_path / "data", num_shards=2)
    (tmp_path / "data" / "more.txt").write_text("\n".join(t.replace("\n", " ") for t in texts[8:]) + "\n",
                                                encoding="utf-8")
    return tmp_path / "data"


def test_a_directory_build_shows_a_total_in_bytes_of_its_files_a_rate_and_an_eta(tmp_path, capsys):
    data = _source_dir(tmp_path)
    assert cli.main(["build", str(data), str(tmp_path / "store"), "--tokenizer", str(generators.tokenizer_path()),
                     "--num-proc", "1"]) == 0
    bar = _final_bar(capsys.readouterr().err)
    size = sum(p.stat().st_size for p in data.iterdir())
    total = tqdm.format_sizeof(size, divisor=1024)
    assert bar.group(5) == "B", f"a directory build's bar counts {bar.group(5)!r}, not bytes: {bar.group(0)!r}"
    assert (bar.group(1), bar.group(2), bar.group(3)) == ("100", total, total), (
        f"final bar {bar.group(0)!r} is not 100% of the {size} bytes of the source's files")
    assert len(TokenStore.open(tmp_path / "store")) == 12


def test_a_gzipped_directory_build_counts_compressed_bytes_to_the_total(tmp_path, capsys):
    texts = generators.load_corpus(limit=12)
    generators.write_jsonl_shards(texts, tmp_path / "plain", num_shards=1)
    (plain,) = (tmp_path / "plain").glob("*.jsonl")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "docs.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    TokenStore.build(tmp_path / "data", generators.tokenizer_path(), tmp_path / "store", num_proc=1, progress=True)
    bar = _final_bar(capsys.readouterr().err)
    size = (tmp_path / "data" / "docs.jsonl.gz").stat().st_size
    total = tqdm.format_sizeof(size, divisor=1024)
    assert (bar.group(1), bar.group(2), bar.group(3)) == ("100", total, total), (
        f"final bar {bar.group(0)!r} is not 100% of the {size} compressed bytes")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log-file"])
def test_the_hf_path_shows_documents_against_the_split_length_on_a_terminal_only(tmp_path, monkeypatch, terminal):
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    split = datasets.Dataset.from_dict({"text": generators.load_corpus(limit=12)})
    tokenize_split(split, generators.tokenizer_path(), tmp_path)
    if not terminal:
        assert stderr.getvalue() == "", f"an HF build wrote {stderr.getvalue()!r} to a stderr that is not a terminal"
        return
    bar = _final_bar(stderr.getvalue())
    assert (bar.group(1), bar.group(2), bar.group(3), bar.group(5)) == ("100", "12", "12", "doc"), (
        f"final bar {bar.group(0)!r} of an HF build of 12 rows")
