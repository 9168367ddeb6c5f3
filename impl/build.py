"""Building a token store: tokenize a source (in this process or in spawned workers) and publish it atomically.

Why apart from :mod:`impl.store`: the store module owns what is on disk and
how it is read; this one owns how it gets there, which is where the hard
failure modes live (parallel workers, locks, a crash half way, replacing an
existing store). :meth:`TokenStore.build` and
:meth:`TokenStore.from_token_files` are the public entry points and delegate
here, passing ``TokenStore.open`` as ``open_store``: the writer opens the
store it publishes (and any store already at ``out_dir``) through it, so this
module imports the format (:mod:`impl.store_format`) but not the reader,
which imports this one.

The pieces, one concept each: :mod:`impl.build_files` (encode, write and
describe one token file; the meta), :mod:`impl.build_pool` (spawned
workers), :mod:`impl.build_progress` (the bar) and :mod:`impl.build_publish`
(lock, temp dir, atomic rename, what may be replaced).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import operator
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from impl.build_files import WriteBehind, file_record, make_meta, write_token_file
from impl.build_pool import cpu_count, file_pieces, piece_docs, run_pool, spawn_can_start
from impl.build_progress import BytesProgress, progress_bar
from impl.build_publish import (
    TOKENIZER_FILE,
    OpenStore,
    StoreT,
    check_output_path,
    publish,
    source_paths,
)
from impl.encoding import Encoder, TokenizerInfo, eos_suggestion, resolve_tokenizer
from impl.errors import ConfigError, EmptyDataError, TokenizerError, UnguardedMainError
from impl.sources import Source, resolve_source
from impl.store_format import DEFAULT_DOCS_PER_FILE, FILE_TEMPLATE, FORMAT_VERSION, BuildOptions

__all__ = ["PreparedBuild", "build_store", "check_output_path", "prepare_build", "store_from_token_files"]

_UINT16_LIMIT = 1 << 16



# --------------------------------------------------------------------------- entry points


_URL_LIKE = re.compile(r"^[a-z][a-z0-9+.-]+:/")


def _refuse_url_output(out_dir: str | os.PathLike[str]) -> None:
    """A one-machine build writes a local directory: an fsspec URL (or one pathlib folded) would land in ``./s3:``.

    >>> _refuse_url_output("s3://bucket/store")
    Traceback (most recent call last):
    reference.errors.ConfigError: out_dir='s3://bucket/store' is a URL, but a one-machine build writes a local directory: ...
    """
    text = os.fspath(out_dir)
    if isinstance(text, str) and _URL_LIKE.match(text):
        raise ConfigError(
            f"out_dir={text!r} is a URL, but a one-machine build writes a local directory: to build into object "
            "storage run the build as one task, `loadspec build SRC URL --tokenizer T --task 0 --tasks 1 "
            "--commit-when-done` (impl.build_tasks.build_task(..., task=0, tasks=1, commit_when_done=True)), or "
            "build locally and upload every file, meta.json last")


def build_store(
    source: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    text_field: str = "text",
    num_proc: int | None = None,
    add_bos: bool = False,
    add_eos: bool = True,
    batch_size: int = 1000,
    docs_per_file: int | None = None,
    progress: bool = True,
    split: str | None = None,
    overwrite: bool = False,
    open_store: OpenStore[StoreT],
) -> StoreT:
    """Tokenize ``source`` into a new store at ``out_dir`` and return it opened with ``open_store``.

    ``open_store``: opens a store at a path (:meth:`TokenStore.open
    <impl.store.TokenStore.open>`, which :meth:`TokenStore.build
    <impl.store.TokenStore.build>` passes); used for the published store and
    for a store already at ``out_dir``.

    ``source``: a ``datasets.Dataset`` / ``IterableDataset``; a
    ``DatasetDict`` with ``split=``; a parquet, arrow (IPC file or stream),
    JSON Lines or txt (one document a line; ``\\n`` separated, a trailing
    ``\\r`` dropped; UTF-8, a leading byte order mark dropped) file, or a directory of them (recursively, sorted by
    relative path, hidden entries skipped); a ``save_to_disk`` directory; a
    ``load_dataset`` cache directory (with ``split=`` if it has several); a
    list of ``pathlib.Path`` files; or an iterable of strings (or of dicts
    holding ``text_field``). A ``str`` source is a path; strings *inside* an
    iterable are documents.

    ``tokenizer``: a directory loadable by ``AutoTokenizer.from_pretrained``,
    a ``tokenizer.json`` file, or a fast tokenizer object. Text is encoded
    with ``add_special_tokens=False``; then ``bos_token_id`` is prepended
    if ``add_bos`` and ``eos_token_id`` appended if ``add_eos``.

    ``num_proc``: worker processes (spawned; ``None`` = CPUs, ``1`` = in this
    process). Ranges of ``docs_per_file`` documents (default
    :data:`DEFAULT_DOCS_PER_FILE`) become files ``tokens-NNNNN.arrow``;
    workers encode pieces of each file (:func:`impl.build_pool.piece_docs`),
    so all of them work however few files the source fills, and the output
    is identical for every ``num_proc``. When ``num_proc > 1`` the
    calling script needs the usual ``if __name__ == "__main__":`` guard;
    without it the build fails at once (:class:`UnguardedMainError` in the
    re-importing worker, :class:`StoreError` naming the guard in the parent)
    instead of hanging. Workers exit with their parent (a killed build leaves
    no process behind) and every wait on them is bounded
    (:data:`WORKER_TIMEOUT_S`).

    Concurrency: the whole build holds ``file_lock(out_dir + ".lock")`` (waiting
    at most :data:`LOCK_TIMEOUT_S`, then :class:`LockTimeoutError` naming the
    holder's pid and host) and
    writes into a temporary sibling directory that is renamed into place
    only when complete (``meta.json`` last). If ``out_dir`` already holds a
    store built from the same source with the same tokenizer and options
    (e.g. by a concurrent builder), that store is returned; a different
    store raises :class:`StoreError` unless ``overwrite=True``. ``overwrite``
    only ever replaces a loadspec store (or fills an empty directory): any
    other directory, a file, or an ``out_dir`` equal to, inside or containing
    a source path raises :class:`UnsafeOutputError` and nothing is deleted.

    Raises :class:`EmptyDataError` for a source with no documents (a
    source whose documents are all empty is stored: they are counted in
    ``num_empty_documents``), :class:`TokenizerError` if a needed special token is
    missing, :class:`SourceError`/:class:`ConfigError` for unreadable input.
    """
    _refuse_unguarded_spawn()
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ConfigError(f"num_proc={num_proc!r}: must be None (all CPUs) or an integer >= 1")
    _refuse_url_output(out_dir)
    check_output_path(out_dir, source_paths(source))
    plan = prepare_build(source, tokenizer, text_field=text_field, add_bos=add_bos, add_eos=add_eos,
                         batch_size=batch_size, docs_per_file=docs_per_file, split=split)
    src, tok_json, tinfo, options, dtype = plan.src, plan.tok_json, plan.tinfo, plan.options, plan.dtype

    def produce(tmp: Path) -> dict[str, Any]:
        records = _tokenize_into(tmp, src, tok_json, tinfo, options, dtype, num_proc, progress)
        if not records:
            raise plan.empty_error()
        return plan.meta(records)

    return publish(out_dir, plan.build_key, overwrite, produce, open_store)


@dataclass(frozen=True, kw_only=True)
class PreparedBuild:
    """What a build decided before tokenizing: the source, the tokenizer, the options, the dtype and the build key.

    Why shared: a local build and every task of a multi-task build
    (:mod:`impl.build_tasks`) must derive the same build key and dtype from
    the same arguments, or their stores would differ.
    """

    src: Source
    tok_json: str
    tinfo: TokenizerInfo
    options: BuildOptions
    dtype: str
    build_key: str | None

    def meta(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The store's meta for the token files ``records`` (in file order)."""
        return make_meta(
            records, dtype=self.dtype, tinfo=self.tinfo, options=self.options.to_json(),
            add_bos=self.options.add_bos, add_eos=self.options.add_eos,
            source={"kind": self.src.kind, "description": self.src.description, "fingerprint": self.src.fingerprint},
            build_key=self.build_key,
        )

    def empty_error(self) -> EmptyDataError:
        return EmptyDataError(
            f"source has no documents: {self.src.describe()}; nothing to store (check the path, split or filter "
            "that produced it)"
        )


def prepare_build(source: Any, tokenizer: Any, *, text_field: str, add_bos: bool, add_eos: bool, batch_size: int,
                  docs_per_file: int | None, split: str | None) -> PreparedBuild:
    """Resolve ``source`` and ``tokenizer`` and check the options as :func:`build_store` does (its errors)."""
    options = BuildOptions(
        text_field=text_field,
        add_bos=add_bos,
        add_eos=add_eos,
        batch_size=batch_size,
        docs_per_file=DEFAULT_DOCS_PER_FILE if docs_per_file is None else docs_per_file,
    )
    tok_json, tinfo = resolve_tokenizer(tokenizer)
    if add_eos and tinfo.eos_id is None:
        from tokenizers import Tokenizer

        tokens = eos_suggestion(Tokenizer.from_str(tok_json).get_vocab(with_added_tokens=True),
                                rejected=tinfo.eos_token)
        named = "" if tinfo.eos_token is None else (
            f" (it names eos_token={tinfo.eos_token!r}, which is not in its vocabulary, so it has no id)")
        raise TokenizerError(
            f"tokenizer {tinfo.class_name} has no eos_token but add_eos=True{named}: set add_eos=False or set the "
            f"tokenizer's eos_token to a token of its vocabulary (tokenizer.eos_token = ...; it holds {tokens})"
        )
    if add_bos and tinfo.bos_id is None:
        raise TokenizerError(
            f"tokenizer {tinfo.class_name} has no bos_token but add_bos=True: set add_bos=False or use a "
            "tokenizer with a bos_token"
        )
    dtype = "uint16" if tinfo.vocab_size <= _UINT16_LIMIT else "uint32"
    src = resolve_source(source, text_field=options.text_field, split=split)
    build_key = None
    if src.fingerprint is not None:
        build_key = hashlib.sha256(json.dumps({
            "format_version": FORMAT_VERSION,
            "options": options.to_json(),
            "tokenizer": tinfo.to_json(),
            "dtype": dtype,
            "source": src.fingerprint,
        }, sort_keys=True).encode()).hexdigest()
    if src.num_documents == 0:
        raise EmptyDataError(
            f"source has no documents: {src.describe()}; nothing to store (check the path, split or filter "
            "that produced it)"
        )
    return PreparedBuild(src=src, tok_json=tok_json, tinfo=tinfo, options=options, dtype=dtype, build_key=build_key)


def store_from_token_files(
    files: Sequence[Sequence[Sequence[int]]],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
    pad_id: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    open_store: OpenStore[StoreT],
) -> StoreT:
    """Write already-tokenized documents as a store: ``files[f][j]`` is document j of store file f.

    Why: tests, the conformance kit and pipelines that tokenize elsewhere
    need stores whose file structure they choose (one store file per input
    file, files with zero documents, documents with zero tokens). Tokens
    are stored as given (no bos/eos added); ids must lie in
    ``[0, vocab_size)`` (``vocab_size`` defaults to the largest id + 1) and
    choose uint16 or uint32 as in :meth:`build`. Unlike :meth:`build`, an
    empty corpus is written (``num_documents == 0``): refusing it is the
    loaders' job (EmptyDataError). Same lock/temp-dir/rename protocol and
    the same "return the identical existing store" rule as :meth:`build`.
    """
    _refuse_unguarded_spawn()
    prepared: list[tuple[np.ndarray, np.ndarray]] = []
    digest = hashlib.sha256(b"loadspec-token-files-v1\0")
    max_id = -1
    for f, docs in enumerate(files):
        docs = list(docs)
        lens = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        total = int(lens.sum())
        try:
            flat = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.int64, count=total)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"file {f}: documents must be sequences of integer token ids ({exc})") from exc
        if total and int(flat.min()) < 0:
            raise ConfigError(f"file {f}: negative token id {int(flat.min())}; token ids are >= 0")
        if total:
            max_id = max(max_id, int(flat.max()))
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        digest.update(len(docs).to_bytes(8, "little"))
        digest.update(offsets.tobytes())
        digest.update(flat.tobytes())
        prepared.append((flat, offsets))
    specials = [i for i in (eos_id, bos_id, pad_id) if i is not None]
    bound = max([max_id, *specials]) + 1
    if vocab_size is None:
        vocab_size = max(bound, 1)
    elif isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < bound:
        raise ConfigError(
            f"vocab_size={vocab_size!r} but the documents/special ids use id {bound - 1}: pass a vocab_size "
            "larger than every token id (or leave it None)"
        )
    if vocab_size > 1 << 32:
        raise ConfigError(f"vocab_size={vocab_size} does not fit uint32 token ids")
    dtype = "uint16" if vocab_size <= _UINT16_LIMIT else "uint32"
    ident = json.dumps({"pretokenized": True, "vocab_size": vocab_size, "eos": eos_id, "bos": bos_id,
                        "pad": pad_id}, sort_keys=True)
    tinfo = TokenizerInfo(
        sha256=hashlib.sha256(ident.encode()).hexdigest(), class_name="pretokenized", vocab_size=vocab_size,
        eos_id=eos_id, bos_id=bos_id, pad_id=pad_id, eos_token=None, bos_token=None, pad_token=None,
    )
    source_fp = digest.hexdigest()
    build_key = hashlib.sha256(json.dumps(
        {"format_version": FORMAT_VERSION, "tokenizer": tinfo.to_json(), "dtype": dtype, "source": source_fp},
        sort_keys=True).encode()).hexdigest()

    def produce(tmp: Path) -> dict[str, Any]:
        records = []
        bar = progress_bar(progress, len(prepared))
        try:
            for index, (flat, offsets) in enumerate(prepared):
                path = str(tmp / FILE_TEMPLATE.format(index))
                write_token_file(path, flat.astype(dtype), offsets)
                records.append(file_record(path, offsets, int(np.count_nonzero(np.diff(offsets) == 0))))
                bar.update(1)
        finally:
            bar.close()
        options = {"pretokenized": True, "add_bos": False, "add_eos": False, "text_field": None,
                   "batch_size": None, "docs_per_file": None}
        return make_meta(records, dtype=dtype, tinfo=tinfo, options=options, add_bos=False, add_eos=False,
                          source={"kind": "token_files", "description": f"{len(prepared)} files",
                                  "fingerprint": source_fp},
                          build_key=build_key)

    return publish(out_dir, build_key, overwrite, produce, open_store)



def _on_file_written(tmp_dir: Path, record: Mapping[str, Any]) -> None:
    """Test seam called after each token file of an in-process build (no-op)."""



def _refuse_unguarded_spawn() -> None:
    """Fail at once when called while a ``spawn`` child re-imports the parent's script.

    Why: a script that calls ``TokenStore.build(..., num_proc=8)`` at top level,
    without an ``if __name__ == "__main__":`` guard, runs that call again in
    every spawned worker; the worker then waits forever on the lock its parent
    holds. multiprocessing marks a child as "inheriting" until its bootstrap
    (the re-import) is over, so a build started then is exactly this mistake.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        main_file = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
        raise UnguardedMainError(
            f"TokenStore.build was called while a spawned worker process was re-importing {main_file}: the "
            "script builds at top level. Put the build under `if __name__ == \"__main__\":` (spawned worker "
            "processes re-import the script), or build with num_proc=1"
        )



def _tokenize_into(tmp: Path, src: Source, tok_json: str, tinfo: TokenizerInfo, options: BuildOptions,
                   dtype: str, num_proc: int | None, progress: bool) -> list[dict[str, Any]]:
    bos_id = tinfo.bos_id if options.add_bos else None
    eos_id = tinfo.eos_id if options.add_eos else None
    bar: Any
    if progress and src.num_documents is None and src.num_bytes and src.batches_with_bytes is not None:
        bar = BytesProgress(progress_bar(True, src.num_bytes, unit="B"))
        batches = bar.track(src.batches_with_bytes())
    else:
        bar = progress_bar(progress, src.num_documents)
        batches = src.batches()
    wanted = cpu_count() if num_proc is None else num_proc
    piece = piece_docs(docs_per_file=options.docs_per_file, batch_size=options.batch_size, workers=wanted,
                       num_documents=src.num_documents)
    pieces = file_pieces(batches, options.docs_per_file, piece)
    head: list[tuple[int, list[str]]] = []
    if wanted > 1:
        # Peek far enough to know whether there are enough pieces to share out.
        head = list(itertools.islice(pieces, wanted))
        wanted = min(wanted, len(head))
    pieces = itertools.chain(head, pieces)
    if wanted > 1 and not spawn_can_start():
        wanted = 1
    records: list[dict[str, Any]] = []
    try:
        if wanted <= 1:
            enc = Encoder(tok_json, dtype=dtype, bos_id=bos_id, eos_id=eos_id, batch_size=options.batch_size)
            ranges = ((index, list(itertools.chain.from_iterable(texts for _, texts in group)))
                      for index, group in itertools.groupby(pieces, key=operator.itemgetter(0)))
            # As a build task: the tokenizer encodes while this thread reads and another writes (build_tasks).
            with WriteBehind(lambda index, rec: _on_file_written(tmp, rec)) as writer:
                for index, values, offsets, num_empty in enc.encode_ranges(ranges, on_batch=bar.update):
                    writer.submit(str(tmp / FILE_TEMPLATE.format(index)), [(values, offsets, num_empty)], tag=index)
                records = writer.finish()
        else:
            threads = max(1, cpu_count() // wanted)
            tok_file = tmp / TOKENIZER_FILE
            tok_file.write_text(tok_json, encoding="utf-8")
            initargs = (str(tok_file), dtype, bos_id, eos_id, options.batch_size, threads, os.getpid())
            try:
                records = run_pool(tmp, pieces, wanted, initargs, bar)
            finally:
                tok_file.unlink(missing_ok=True)
    finally:
        bar.close()
    return records


