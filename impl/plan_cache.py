"""The on-disk plan cache: an epoch's ``PackPlan`` written once, mapped by every other process, never trusted blindly.

``PlanCache(directory).load_or_compute(entry, compute)`` is the whole
interface: the plan named by ``entry.key`` from the cache when its files are
intact, else ``compute()``'s, written for the next process (PACK-20).
``impl.dataset.PackedDataset`` names its plans (:func:`plan_key`) and keeps
the last ones in memory; this module owns the files. A mixture's plan
(``impl.mixing.MixPlan``, named by :func:`mix_plan_key`) is cached the same
way by ``PlanCache.load_or_compute_mix``, checked whole when read.

Layout: one flat int64 ``.npy`` plus a JSON sidecar holding its size, field
layout and one CRC-32 per ``PLAN_BLOCK`` values, written atomically (the
``.npy`` first) under a file lock. A file whose sidecar, size or header does
not match is recomputed; a block is checked the first time a lookup reads
it, and one that fails makes the plan recompute itself (and the file be
rewritten): a fresh process checks only the blocks its first batch reads.

    >>> from impl.packing import pack_plan
    >>> from reference.packing import PackingConfig
    >>> import tempfile
    >>> entry = PlanEntry(key="ab" * 32, mode="concat", seq_len=4, provenance={})
    >>> with tempfile.TemporaryDirectory() as d:
    ...     made = PlanCache(Path(d)).load_or_compute(entry, lambda: pack_plan([3, 6, 1], PackingConfig(seq_len=4)))
    ...     read = PlanCache(Path(d)).load_or_compute(entry, lambda: None)   # from the files: compute is not called
    >>> made.num_samples, read.num_samples, read.arrays["cum"].tolist()
    (2, 2, [0, 3, 9, 10])
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import mmap
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from impl._atomic import atomic_write_bytes, atomic_write_json, file_lock, lock_path_for
from impl._crc import crc32
from impl.errors import ConfigError, require
from impl.mixing import MixPlan
from impl.packing import BIN_FIELDS, STREAM_FIELDS, PackPlan, PlanCorruptError
from reference.packing import STREAM_MODES
from reference.resume import PipelineConfig, canonical_json

__all__ = ["MIX_PLAN_FORMAT", "MIX_PLAN_VERSION", "PLAN_BLOCK", "PLAN_FORMAT", "PLAN_RELEVANT", "PLAN_VERSION",
           "PlanCache", "PlanEntry", "mix_plan_key", "plan_cache_dir", "plan_key", "refuse_file_cache_dir"]

PLAN_FORMAT = "loadspec.plan"
PLAN_VERSION = 4
PLAN_BLOCK = 1 << 13
"""int64 values per checksummed block of a cached plan (64 KiB): the unit a fresh loader verifies on first use."""
MIX_PLAN_FORMAT = "loadspec.mixplan"
MIX_PLAN_VERSION = 1
MIX_FIELDS = ("source", "item")
"""A mixture's plan (``impl.mixing.MixPlan``) as the cache lays it out: the two arrays, in this order."""
PLAN_RELEVANT = ("seq_len", "mode", "window", "overflow", "stride", "bos_on_continuation", "add_bos", "add_eos",
                 "min_len")
"""The ``PackingConfig`` fields a plan depends on (the others are written by the fill): part of :func:`plan_key`."""


def plan_key(store_fingerprint: str, config: PipelineConfig, plan_epoch: int) -> str:
    """sha256 naming a plan: store fingerprint, plan-relevant config fields, epoch, format.

    >>> from reference.packing import PackingConfig
    >>> len(plan_key("f" * 64, PipelineConfig(packing=PackingConfig(seq_len=4)), 0))
    64
    """
    o = config.ordering
    ordering = ({"kind": "sequential"} if o.kind == "sequential"          # asdict's deep copy is a visible share of a resume
                else {field.name: getattr(o, field.name) for field in dataclasses.fields(o)})
    packing = {name: getattr(config.packing, name) for name in PLAN_RELEVANT}
    payload = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "store": store_fingerprint,
               "ordering": ordering, "packing": packing, "epoch": plan_epoch}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def mix_plan_key(*, source_fingerprints: Sequence[str], source_sizes: Sequence[int], epoch: int,
                 weights: Sequence[float] | None, stopping: str, seed: int, weight_fn: str | None,
                 streams: Sequence[Mapping[str, Any]] | None, epoch_size: int | None, batching_method: str,
                 global_batch_size: int | None, device_batch_size: int | None) -> str:
    """sha256 naming a mixture's epoch plan: every input of ``mix_plan`` / ``stream_plan``, the sources, the format.

    The plan is a pure function of the sources' sizes, the mixing (or
    streams) config and the epoch; the sources' fingerprints (store and
    pipeline) name the data the sizes came from, so two mixtures share an
    entry only when they mix the same data. Nothing of the topology enters:
    the plan is the same on every rank and every world size. ``weight_fn``
    is the name of a weight function whose code the cache knows (only
    ``impl.mixing.balance_remaining``); other callables are not cached.

    >>> key = dict(source_fingerprints=["a" * 64, "b" * 64], source_sizes=[3, 2], epoch=0, weights=None,
    ...            stopping="all_exhausted", seed=0, weight_fn=None, streams=None, epoch_size=None,
    ...            batching_method="random", global_batch_size=None, device_batch_size=None)
    >>> mix_plan_key(**key) == mix_plan_key(**dict(key, epoch=1))
    False
    """
    payload = {"format": MIX_PLAN_FORMAT, "version": MIX_PLAN_VERSION, "sources": list(source_fingerprints),
               "sizes": [int(n) for n in source_sizes], "epoch": int(epoch),
               "weights": None if weights is None else [float(w) for w in weights], "stopping": stopping,
               "seed": int(seed), "weight_fn": weight_fn,
               "streams": None if streams is None else [dict(x) for x in streams], "epoch_size": epoch_size,
               "batching_method": batching_method, "global_batch_size": global_batch_size,
               "device_batch_size": device_batch_size}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "loadspec" / "plans"


def refuse_file_cache_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """``cache_dir`` as a Path, or a ``ConfigError`` when it (or a folder above it) is a file.

    Why: creating a directory there fails with "File exists (errno 17)" or
    "Not a directory (errno 20)", which names neither the argument nor the file.

    >>> refuse_file_cache_dir(__file__)   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: cache_dir=... is a file, not a directory; pass the path of a directory ...
    """
    path = Path(cache_dir)
    for where in (path, *path.parents):
        if where.exists():
            require(where.is_dir(), ConfigError,
                    f"cache_dir={str(path)!r} is a file, not a directory" + ("" if where == path else
                    f" ({str(where)!r}, a folder above it, is a file)") + "; pass the path of a directory (it is "
                    "created if missing), or remove the file")
            break
    return path


def _writable_dir(path: Path) -> bool:
    if os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):   # the usual case, without mkdir's failed call
        return True
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def plan_cache_dir(cache_dir: Any, store_path: str | os.PathLike[str] | None) -> Path | None:
    """The directory plans are cached in: ``cache_dir`` when given, else ``<store>/.plans``, else the user cache.

    ``cache_dir=False`` keeps plans in memory only (None); ``None`` or
    ``True`` picks the first writable of the store's ``.plans`` (when there
    is a store and it is not remote, whose path is a URL) and
    ``$XDG_CACHE_HOME/loadspec/plans`` (None when neither is); a path must
    be a writable directory (created if missing).
    """
    if cache_dir is False:
        return None
    if cache_dir is not None and cache_dir is not True:
        path = refuse_file_cache_dir(cache_dir)
        require(_writable_dir(path), ConfigError,
                f"cache_dir={str(path)!r} cannot be created or written; pass a writable directory, or "
                "cache_dir=False to keep plans in memory only")
        return path
    # A remote store's path is its URL (``s3://bucket/store``), no directory here: plans go to the user cache.
    remote = store_path is not None and re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/", os.fspath(store_path)) is not None
    candidates = [_user_cache_dir()] if store_path is None or remote else [Path(store_path) / ".plans", _user_cache_dir()]
    for candidate in candidates:
        if _writable_dir(candidate):
            return candidate
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanEntry:
    """What names a cached plan (``key``, from :func:`plan_key`), its shape, and what its sidecar records for people.

    ``provenance`` (epoch, store fingerprint, config) is written to the
    sidecar and never checked: the key already covers it.
    """

    key: str
    mode: str
    seq_len: int
    provenance: Mapping[str, Any]


class PlanCache:
    """Plans cached as files in ``directory`` (None: no files, every plan computed); see the module docstring."""

    __slots__ = ("directory",)

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def __repr__(self) -> str:
        return f"PlanCache({str(self.directory)!r})"

    def paths(self, key: str) -> tuple[Path, Path] | None:
        """``(npy, json sidecar)`` of the plan named ``key``, or None without a cache directory."""
        if self.directory is None:
            return None
        stem = f"plan-{key[:40]}"
        return self.directory / f"{stem}.npy", self.directory / f"{stem}.json"

    def load_or_compute(self, entry: PlanEntry, compute: Callable[[], PackPlan]) -> PackPlan:
        """The plan of ``entry`` from its files when they are intact, else ``compute()``'s (written for the next reader)."""
        paths = self.paths(entry.key)
        if paths is None:
            return compute()
        plan = self._read(entry, compute, *paths)
        if plan is not None:
            return plan
        return self._compute_and_write(entry, compute, *paths)

    def _compute_and_write(self, entry: PlanEntry, compute: Callable[[], PackPlan], npy: Path, sidecar: Path) -> PackPlan:
        """The plan computed and written to the cache (under its lock; another process may have written it first)."""
        try:
            with file_lock(lock_path_for(npy)):
                plan = self._read(entry, compute, npy, sidecar)
                if plan is None:
                    plan = compute()
                    _write(entry, plan, npy, sidecar)
                    plan = self._read(entry, compute, npy, sidecar) or plan
        except OSError as exc:
            warnings.warn(f"could not cache the epoch plan in {self.directory} ({exc}); keeping it in memory. "
                          "Pass a writable cache_dir to share plans across processes", RuntimeWarning, stacklevel=3)
            plan = compute()
        return plan

    def _recover(self, entry: PlanEntry, compute: Callable[[], PackPlan], npy: Path,
                 sidecar: Path) -> Mapping[str, np.ndarray]:
        """A cached plan failed a block check while in use: recompute it, rewrite the cache, hand back the arrays."""
        warnings.warn(f"the cached epoch plan {npy} is corrupt (a block failed its CRC-32); recomputing it",
                      RuntimeWarning, stacklevel=4)
        plan = compute()
        try:
            with file_lock(lock_path_for(npy)):
                _write(entry, plan, npy, sidecar)
        except OSError:
            pass
        return plan.arrays

    def _read(self, entry: PlanEntry, compute: Callable[[], PackPlan], npy: Path, sidecar: Path) -> PackPlan | None:
        """The cached plan if its sidecar and size match, checked block by block as it is read; None otherwise.

        Why per block and CRC-32: the check guards against a torn or
        bit-rotted file (the atomic rename already rules out a half-written
        one), not an adversary, and it runs in every fresh loader on the
        resume path. Checking the whole file first would cost more than the
        rest of a resume at a million documents; a batch reads a few
        64 KiB blocks, each checked on its first use (``PackPlan``'s
        ``verify``). A block that fails makes the plan recompute itself
        (and the cache file be rewritten), never serve the block.
        """
        try:
            meta = json.loads(sidecar.read_bytes())
            if not isinstance(meta, dict):
                return None
            expected = _sidecar_expected(entry)
            if any(meta.get(k) != v for k, v in expected.items()):
                return None
            mapped = _map_flat(meta, npy)
            if mapped is None:
                return None
            flat, layout, crcs = mapped
            arrays = {name: flat[at:at + n] for name, at, n in layout}
            verify = _BlockCheck(flat, {name: at for name, at, _ in layout}, crcs)
            return PackPlan(entry.mode, entry.seq_len, arrays, verify=verify,
                            recover=lambda: self._recover(entry, compute, npy, sidecar))
        except PlanCorruptError as exc:
            warnings.warn(f"the cached epoch plan {npy} is corrupt ({exc}); recomputing it", RuntimeWarning, stacklevel=4)
            return None
        except (OSError, ValueError, KeyError, TypeError, ConfigError):
            return None


    # ------------------------------------------------------------ a mixture's plan

    def load_or_compute_mix(self, key: str, source_sizes: Sequence[int], compute: Callable[[], MixPlan],
                            provenance: Mapping[str, Any]) -> MixPlan:
        """The mixture plan named ``key`` (:func:`mix_plan_key`) from its files when intact, else ``compute()``'s.

        Why the whole file is checked on read, not block by block as a
        ``PackPlan``: a mixture plan is two arrays that the mixture indexes
        directly; at a million documents (~320k samples of 2048 tokens) it is
        5 MB, a millisecond of CRC, where computing it costs tens of
        milliseconds (seconds with ``balance_remaining``). A file that fails
        any check (sidecar, size, header, a block's CRC-32, a source or item
        out of range) is recomputed and rewritten, never served.
        """
        paths = self.paths(key)
        if paths is None:
            return compute()
        plan = _read_mix(key, source_sizes, *paths)
        if plan is not None:
            return plan
        try:
            with file_lock(lock_path_for(paths[0])):
                plan = _read_mix(key, source_sizes, *paths)
                if plan is None:
                    plan = compute()
                    _write_flat(_mix_expected(key), {"source": plan.source, "item": plan.item}, *paths, provenance)
        except OSError as exc:
            warnings.warn(f"could not cache the mixture's epoch plan in {self.directory} ({exc}); keeping it in "
                          "memory. Pass a writable cache_dir to share plans across processes", RuntimeWarning,
                          stacklevel=3)
            plan = compute()
        return plan


def _mix_expected(key: str) -> dict[str, Any]:
    return {"format": MIX_PLAN_FORMAT, "version": MIX_PLAN_VERSION, "key": key, "block": PLAN_BLOCK}


def _read_mix(key: str, source_sizes: Sequence[int], npy: Path, sidecar: Path) -> MixPlan | None:
    """The cached mixture plan when every check passes (see ``PlanCache.load_or_compute_mix``), else None."""
    try:
        meta = json.loads(sidecar.read_bytes())
        if not isinstance(meta, dict) or any(meta.get(k) != v for k, v in _mix_expected(key).items()):
            return None
        mapped = _map_flat(meta, npy)
        if mapped is None:
            return None
        flat, layout, crcs = mapped
        n = len(flat) // 2
        if [list(x) for x in layout] != [["source", 0, n], ["item", n, n]]:
            return None
        for b, expected in enumerate(crcs):
            if crc32(flat[b * PLAN_BLOCK:(b + 1) * PLAN_BLOCK].data) != expected:
                warnings.warn(f"the cached mixture plan {npy} is corrupt (block {b} failed its CRC-32); recomputing it",
                              RuntimeWarning, stacklevel=4)
                return None
        source, item = flat[:n], flat[n:]
        sizes = np.asarray([int(x) for x in source_sizes], dtype=np.int64)
        if n and not (0 <= int(source.min()) and int(source.max()) < len(sizes) and int(item.min()) >= 0
                      and bool((item < sizes[source]).all())):
            return None
        return MixPlan(source, item)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sidecar_expected(entry: PlanEntry) -> dict[str, Any]:
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "key": entry.key, "mode": entry.mode,
            "seq_len": entry.seq_len, "block": PLAN_BLOCK}


def _write(entry: PlanEntry, plan: PackPlan, npy: Path, sidecar: Path) -> None:
    """The plan as one flat int64 ``.npy`` and a JSON sidecar: layout, size and one CRC-32 per ``PLAN_BLOCK`` values.

    The sidecar is written after the ``.npy`` (both atomically), so a
    sidecar always describes a complete file; a reader checks a block's
    CRC the first time it reads from the block.
    """
    fields = STREAM_FIELDS if plan.mode in STREAM_MODES else BIN_FIELDS
    _write_flat(_sidecar_expected(entry), {name: plan.arrays[name] for name in fields}, npy, sidecar,
                entry.provenance)


def _write_flat(expected: Mapping[str, Any], named: Mapping[str, np.ndarray], npy: Path, sidecar: Path,
                provenance: Mapping[str, Any]) -> None:
    """``named``'s arrays as one flat int64 ``.npy``, then its sidecar: ``expected``, layout, size, block CRC-32s."""
    fields = list(named)
    arrays = [np.asarray(named[name], dtype=np.int64) for name in fields]
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    buf = io.BytesIO()
    np.save(buf, flat, allow_pickle=False)
    data = buf.getvalue()
    atomic_write_bytes(npy, data)
    layout, at = [], 0
    for name, arr in zip(fields, arrays):
        layout.append([name, at, len(arr)])
        at += len(arr)
    blocks = [crc32(flat[i:i + PLAN_BLOCK].data) for i in range(0, len(flat), PLAN_BLOCK)]
    meta = dict(expected, fields=layout, npy_bytes=len(data), values=len(flat), block_crc32=blocks, **provenance)
    atomic_write_json(sidecar, meta)


def _map_flat(meta: Mapping[str, Any], npy: Path) -> tuple[np.ndarray, list[list[Any]], list[int]] | None:
    """``(values, field layout, block CRC-32s)`` of the ``.npy`` its sidecar ``meta`` describes; None unless they agree."""
    flat = _map_npy(npy, meta["values"], meta["npy_bytes"])   # None unless the file has that size
    layout, crcs = meta["fields"], meta["block_crc32"]
    if (flat is None or sum(n for _, _, n in layout) != len(flat)
            or len(crcs) != -(-len(flat) // PLAN_BLOCK)):
        return None
    return flat, layout, crcs


@functools.lru_cache(maxsize=16)
def _npy_header(values: int) -> bytes:
    """The header ``np.save`` writes before ``values`` int64 values (a plan file is exactly that header, then the values)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
                                               "fortran_order": False, "shape": (values,)})
    return buf.getvalue()


def _map_npy(path: Path, values: int, size: int) -> np.ndarray | None:
    """The int64 values of a plan ``.npy`` as a read-only view of its mapped pages; None unless its header is ``np.save``'s.

    Why not ``np.load(mmap_mode="r")``: ``np.memmap``'s machinery is a large
    share of the resume path; one ``mmap`` and a header comparison do the
    same check for a fraction of it.
    """
    header = _npy_header(values)
    if size != len(header) + 8 * values:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        if size == len(header):
            return np.zeros(0, dtype=np.int64) if os.read(fd, size + 1) == header else None
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    if len(mapped) != size or mapped[:len(header)] != header:
        return None
    return np.frombuffer(mapped, dtype=np.int64, count=values, offset=len(header))


class _BlockCheck:
    """A cached plan's :data:`impl.packing.Verifier`: CRC-32 of each ``PLAN_BLOCK``-value block, on its first read.

    >>> flat = np.arange(3 * PLAN_BLOCK, dtype=np.int64)
    >>> check = _BlockCheck(flat, {"cum": 0}, [crc32(flat[i:i + PLAN_BLOCK].data) for i in range(0, len(flat), PLAN_BLOCK)])
    >>> check("cum", 5, PLAN_BLOCK); check.ok.tolist()     # values 5 .. PLAN_BLOCK: blocks 0 and 1
    [True, True, False]
    """

    __slots__ = ("crcs", "flat", "ok", "starts")

    def __init__(self, flat: np.ndarray, starts: dict[str, int], crcs: list[int]) -> None:
        self.flat = flat
        self.starts = starts
        self.crcs = crcs
        self.ok = np.zeros(len(crcs), dtype=bool)

    def __call__(self, field: str, first: int, last: int) -> None:
        at = self.starts[field]
        b0, b1 = (at + first) // PLAN_BLOCK, (at + last) // PLAN_BLOCK
        if b0 == b1:
            if self.ok[b0]:
                return
        elif self.ok[b0:b1 + 1].all():
            return
        for b in range(b0, b1 + 1):
            if self.ok[b]:
                continue
            if crc32(self.flat[b * PLAN_BLOCK:(b + 1) * PLAN_BLOCK].data) != self.crcs[b]:
                raise PlanCorruptError(f"block {b} of a cached plan failed its CRC-32")
            self.ok[b] = True
