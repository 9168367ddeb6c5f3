"""How each loader is built, resumed and iterated; shared by the pytest benchmarks and ``benchmarks.rss``.

Every function here is untimed plumbing: the benchmark modules decide what
falls inside the timer. Peers are imported lazily so the core venv (no
peers) can import this module.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.corpora import Corpus, _locked
from benchmarks.workloads import HF_ITERABLE_SHARDS, SEQ_LEN, TPUT_BATCH

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("STREAMING_DISABLE_TELEMETRY", "1")


def _quiet_hf() -> None:
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:
        pass


# --------------------------------------------------------------------------- impl


def impl_dataset(corpus: Corpus, *, shuffle: str = "global", packing: str = "concat", cache: bool = True):
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    store = TokenStore.open(corpus.store())
    return PackedDataset(store, seq_len=SEQ_LEN, packing=packing, shuffle=shuffle, seed=0,
                         cache_dir=None if cache else False)


def impl_loader(dataset, *, batch_size: int, num_workers: int = 0):
    from impl.loader import build_dataloader

    return build_dataloader(dataset, batch_size=batch_size, rank=0, world_size=1, num_workers=num_workers)


def impl_state(loader, consumed: int) -> dict[str, Any]:
    """The resume state at ``consumed`` samples of epoch 0 (the format RES-2 defines; no iteration needed)."""
    from reference.resume import make_state

    return make_state(loader.fingerprint, 0, consumed)


def unchecked_store(path: str | os.PathLike[str]) -> Any:
    """A new store object whose files carry no integrity checks (no block or document table consulted), all mapped.

    The baseline of the first-read benchmarks (``test_integrity``,
    ``first_epoch``): the same mapping and reads as a checked store, no check.
    """
    from unittest import mock

    from impl.store import TokenStore
    from impl.store_files import StoreFiles

    with mock.patch.object(StoreFiles, "new_blocks", lambda self, *args: None):
        store = TokenStore.open(path)
        none = np.empty(0, dtype=np.int64)
        for f in range(store.num_files):
            store.check_blocks(f, none, none)   # no range: maps the file (registering no checks) and reads nothing
    return store


def time_packed_batches(store: Any, *, shuffle: str, batches: int, check_calls: bool = True) -> tuple[float, int]:
    """``(seconds, tokens)`` of ``batches`` packed batches of ``TPUT_BATCH`` after an untimed first, from sample 0.

    ``check_calls=False`` also tells the fill that the store's bounds check
    its documents (``document_checks``), so it makes no check call of any
    format: over an :func:`unchecked_store` of format 3 the fill would still
    call ``check_blocks_batch`` for every run, with nothing to check.
    """
    import contextlib
    import time
    from unittest import mock

    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    with contextlib.ExitStack() as stack:
        if not check_calls:
            stack.enter_context(mock.patch.object(TokenStore, "document_checks", True))
        dataset = PackedDataset(store, seq_len=SEQ_LEN, packing="concat", shuffle=shuffle, seed=0)
        loader = impl_loader(dataset, batch_size=TPUT_BATCH)
        loader.load_state_dict(impl_state(loader, 0))
        it = iter(loader)
        next(it)
        tokens = 0
        start = time.perf_counter()
        for _ in range(batches):
            tokens += batch_tokens(next(it))
        return time.perf_counter() - start, tokens


def batch_tokens(batch: Any) -> int:
    return int(batch["input_ids"].numel())


# --------------------------------------------------------------------------- the limit: raw mmap gather


def mapped_token_files(store_path: Path) -> list[np.ndarray]:
    """Each token file's values as a numpy view of a ``pa.memory_map`` (independent of impl's reader)."""
    import pyarrow as pa

    meta = json.loads((store_path / "meta.json").read_text())
    out = []
    for rec in meta["files"]:
        with pa.memory_map(str(store_path / rec["name"]), "r") as mm:
            batch = pa.ipc.open_file(mm).get_batch(0)
        out.append(batch.column(0).values.to_numpy(zero_copy_only=True))
    return out


def sample_runs(dataset, epoch: int, indices: range, file_token_starts: list[int]) -> list[list[tuple[int, int, int]]]:
    """Per sample: ``(file, start, stop)`` contiguous token runs its ``input_ids`` came from (padding skipped)."""
    offsets = dataset.store.doc_offsets
    fts = np.asarray(file_token_starts, dtype=np.int64)
    runs_per_sample = []
    for i in indices:
        s = dataset.sample(epoch, i)
        keep = (s["doc_ids"] >= 0) & (s["token_offsets"] >= 0)
        pos = offsets[s["doc_ids"][keep]] + s["token_offsets"][keep]
        runs = []
        if len(pos):
            breaks = np.flatnonzero(np.diff(pos) != 1) + 1
            for seg in np.split(pos, breaks):
                a, b = int(seg[0]), int(seg[-1]) + 1
                f = int(np.searchsorted(fts, a, side="right") - 1)
                while b > a:  # split at file boundaries
                    stop = min(b, int(fts[f + 1]))
                    runs.append((f, a - int(fts[f]), stop - int(fts[f])))
                    a, f = stop, f + 1
        runs_per_sample.append(runs)
    return runs_per_sample


def _copy_batch(out: np.ndarray, files: list[np.ndarray], batch: list[list[tuple[int, int, int]]]) -> int:
    """Copy each row's token runs into ``out[row]`` (``[B, seq_len]``); tokens copied."""
    total = 0
    for row, runs in enumerate(batch):
        at = 0
        for f, a, b in runs:
            out[row, at:at + b - a] = files[f][a:b]
            at += b - a
        total += at
    return total


def raw_gather(files: list[np.ndarray], batches: list[list[list[tuple[int, int, int]]]], seq_len: int) -> int:
    """Copy every batch's token runs out of the mapped files into a fresh ``[B, seq_len]`` buffer; tokens copied."""
    return sum(_copy_batch(np.empty((len(batch), seq_len), dtype=files[0].dtype), files, batch) for batch in batches)


def floor_gather(files: list[np.ndarray], batches: list[list[list[tuple[int, int, int]]]], seq_len: int) -> int:
    """The least any loader must do to hand out the issue's four int64 ``[B, seq_len]`` fields; tokens copied.

    ``raw_gather``'s copies, but into int64, plus one write of each other
    field (labels as the shifted ids, positions as ``arange``, doc ids as a
    constant) and no per-document work at all: the memory traffic of the
    output, without computing its values. A loader that produces
    ``input_ids``, ``labels``, ``position_ids`` and ``doc_ids`` as int64
    cannot beat this; ``impl``'s fraction of it measures what its
    computation costs on top.
    """
    total = 0
    positions = np.arange(seq_len, dtype=np.int64)
    for batch in batches:
        out = np.empty((4, len(batch), seq_len), dtype=np.int64)
        ids, labels, pos, docs = out
        total += _copy_batch(ids, files, batch)
        labels[:, :-1] = ids[:, 1:]
        labels[:, -1] = -100
        pos[:] = positions
        docs.fill(0)
    return total


# --------------------------------------------------------------------------- HF datasets


def hf_from_disk(corpus: Corpus):
    import datasets

    _quiet_hf()
    return datasets.load_from_disk(str(corpus.hf_disk()))


def hf_iterable(corpus: Corpus, base=None):
    ds = base if base is not None else hf_from_disk(corpus)
    return ds.to_iterable_dataset(num_shards=HF_ITERABLE_SHARDS).with_format("numpy")


def hf_streaming(corpus: Corpus):
    import datasets

    _quiet_hf()
    return datasets.load_dataset("parquet", data_files=corpus.parquet_files(), split="train",
                                 streaming=True).with_format("numpy")


def _state_cache(corpus: Corpus, name: str, n: int) -> Path:
    import datasets

    return corpus.root / "states" / f"{name}-{datasets.__version__}-{n}.json"


def hf_state_at(corpus: Corpus, name: str, make_iterable, n: int) -> dict[str, Any]:
    """The HF IterableDataset state after ``n`` examples, by iterating once (cached on disk per version)."""
    path = _state_cache(corpus, name, n)
    if path.exists():
        return json.loads(path.read_text())
    with _locked(path):
        if path.exists():
            return json.loads(path.read_text())
        ids = make_iterable()
        it = iter(ids)
        for _ in itertools.islice(it, n):
            pass
        state = ids.state_dict()
        del it
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state))
    return state


# --------------------------------------------------------------------------- MosaicML streaming


_MOSAIC_LIVE: list = []   # (weakref to a StreamingDataset, its shm prefix int)


def mosaic_cleanup() -> None:
    """Release the shared memory of the StreamingDatasets we dropped, so the next one reuses their prefix.

    Call only when no dataset created here is in use any more.

    Why: streaming keeps every instance's shared memory (and lock files) until
    the process exits, and each new instance probes all earlier prefixes,
    opening (and never closing) a descriptor per probe: k instances in one
    process cost O(k^2) descriptors (the run died at ulimit -n 20000) and
    make construction slower the more instances came before. Unlinking the
    segments of instances we created and dropped keeps every construction
    equal to the first one in a fresh process.
    """
    import re
    import tempfile

    gc.collect()
    tmp = tempfile.gettempdir()
    prefixes = {prefix for _, prefix in _MOSAIC_LIVE}
    # Lock files left by earlier (dead) processes: no live segment under their prefix.
    for name in os.listdir(tmp):
        m = re.fullmatch(r"(\d{6})_\w+_filelock", name)
        if m and not os.path.exists(f"/dev/shm/{m.group(1)}_locals"):
            prefixes.add(int(m.group(1)))
    for prefix in prefixes:
        tag = f"{prefix:06}_"
        for root in ("/dev/shm", tmp):
            try:
                names = [n for n in os.listdir(root) if n.startswith(tag)]
            except OSError:
                continue
            for name in names:
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass
    _MOSAIC_LIVE.clear()


def mosaic_dataset(corpus: Corpus, batch_size: int, cleanup: bool = True):
    """A MosaicML StreamingDataset over the MDS copy; ``cleanup=False`` inside timers (gc is slow)."""
    import weakref

    from benchmarks.peers import import_streaming

    streaming = import_streaming()
    if cleanup:
        mosaic_cleanup()
    ds = streaming.StreamingDataset(local=str(corpus.mds()), batch_size=batch_size, shuffle=False)
    _MOSAIC_LIVE.append((weakref.ref(ds), int(getattr(ds, "_shm_prefix_int", -1))))
    return ds


def mosaic_state(n: int) -> dict[str, Any]:
    return {"epoch": 0, "sample_in_epoch": n, "num_canonical_nodes": 1, "shuffle_seed": 9176,
            "initial_physical_nodes": 1}


# --------------------------------------------------------------------------- LitData


def litdata_loader(corpus: Corpus, batch_size: int, num_workers: int = 0):
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(str(corpus.litdata()), shuffle=False)
    return StreamingDataLoader(ds, batch_size=batch_size, num_workers=num_workers, collate_fn=list_collate)


def litdata_state(corpus: Corpus, batch_size: int, n: int) -> dict[str, Any]:
    """LitData's loader state at ``n`` samples: taken after one batch, then moved to ``n``."""
    loader = litdata_loader(corpus, batch_size)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    state = json.loads(json.dumps(state))
    state["num_samples_yielded"] = n
    state["dataset"]["num_samples_yielded"] = n
    state["dataset"]["sample_in_epoch"] = n
    return state


def list_collate(items: list[Any]) -> list[Any]:
    return items


def doc_tokens(item: Any) -> int:
    """Tokens in one peer item (a numpy array, or a dict holding ``input_ids``)."""
    if isinstance(item, dict):
        item = item["input_ids"]
    return len(item)


def take(iterator: Iterator[Any], n: int) -> list[Any]:
    return list(itertools.islice(iterator, n))
