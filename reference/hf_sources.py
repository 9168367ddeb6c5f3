"""Which files an HF ``datasets`` directory streams, in which order (STREAM-19).

Why a rule of its own: a ``save_to_disk`` directory or a ``load_dataset``
cache holds its rows in Arrow stream files (STREAM-18) beside JSON metadata
that says which files belong to which split and in what order; the file
order is the row order, so it decides every row's global number (STREAM-9)
and must not hang on how a directory listing happens to sort.

The model: a directory is a mapping from the names of the files under it
(``"train/state.json"``) to their bytes; only the JSON files' bytes are read.

Worked example (a ``DatasetDict`` saved with ``save_to_disk``)::

    >>> d = {"dataset_dict.json": b'{"splits": ["train", "test"]}',
    ...      "train/state.json": b'{"_data_files": [{"filename": "data-00001-of-00002.arrow"},'
    ...                          b' {"filename": "data-00000-of-00002.arrow"}]}',
    ...      "train/data-00000-of-00002.arrow": b"", "train/data-00001-of-00002.arrow": b"",
    ...      "test/state.json": b'{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}',
    ...      "test/data-00000-of-00001.arrow": b""}
    >>> hf_data_files(d, split="train")
    ['train/data-00001-of-00002.arrow', 'train/data-00000-of-00002.arrow']
    >>> hf_data_files(d)
    Traceback (most recent call last):
    ...
    reference.errors.SourceError: the directory is a DatasetDict of splits ['train', 'test']; pass split=<one of them>
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from reference.errors import SourceError, require

_CACHE_FILE = re.compile(r"^(?P<builder>.+?)-(?P<split>[^-/]+?)(?:-(?P<k>\d{5})-of-(?P<n>\d{5}))?\.arrow$")


def _json(listing: Mapping[str, bytes], name: str) -> Any:
    try:
        return json.loads(listing[name])
    except (ValueError, UnicodeDecodeError):
        raise SourceError(f"{name} is not JSON; the directory is damaged: save it again") from None


def cache_shards(names: list[str]) -> dict[str, list[str]]:
    """A ``load_dataset`` cache's arrow files by split, each split's shards in shard order (STREAM-19).

    >>> cache_shards(["json-train-00001-of-00002.arrow", "json-train-00000-of-00002.arrow", "json-test.arrow"])
    {'train': ['json-train-00000-of-00002.arrow', 'json-train-00001-of-00002.arrow'], 'test': ['json-test.arrow']}
    """
    found: dict[str, list[tuple[int, int, str]]] = {}
    for name in names:
        m = _CACHE_FILE.match(name)
        if m is not None:
            k, n = (int(m["k"]), int(m["n"])) if m["k"] is not None else (0, 1)
            found.setdefault(m["split"], []).append((k, n, name))
    out: dict[str, list[str]] = {}
    for split, shards in found.items():
        shards.sort()
        total = shards[0][1]
        require([(k, n) for k, n, _ in shards] == [(k, total) for k in range(total)], SourceError,
                f"split {split!r} holds shards {[s for *_, s in shards]}, not all {total} of its shards once: a "
                "load_dataset run was cut short; run load_dataset again with download_mode='force_redownload'")
        out[split] = [s for *_, s in shards]
    return out


def hf_data_files(listing: Mapping[str, bytes], split: str | None = None) -> list[str]:
    """The data files of an HF directory, in row order (STREAM-19).

    * ``dataset_dict.json`` (a ``DatasetDict`` from ``save_to_disk``): ``split``
      must name one of its ``splits``; the files are those of ``<split>/``.
    * ``state.json`` (a ``Dataset`` from ``save_to_disk``): the ``filename`` of
      each entry of ``_data_files``, in that order; ``split``, when given, must
      be the state's ``_split``.
    * ``dataset_info.json`` alone (a ``load_dataset`` cache directory): the
      arrow files ``<builder>-<split>[-<k>-of-<n>].arrow`` of one split, in
      shard order; ``split`` may be left out only when one split is there.
    * anything else raises ``SourceError``, as does a named file that is missing.

    >>> hf_data_files({"dataset_info.json": b"{}", "json-train.arrow": b"", "json-test.arrow": b""}, split="test")
    ['json-test.arrow']
    """
    if "dataset_dict.json" in listing:
        splits = _json(listing, "dataset_dict.json").get("splits", [])
        require(split is not None and split in splits, SourceError,
                f"the directory is a DatasetDict of splits {splits}; pass split=<one of them>"
                if split is None else f"split={split!r} is not among the DatasetDict's splits {splits}; pass one of them")
        prefix = f"{split}/"
        inner = {name[len(prefix):]: data for name, data in listing.items() if name.startswith(prefix)}
        return [prefix + name for name in hf_data_files(inner)]
    if "state.json" in listing:
        state = _json(listing, "state.json")
        require(split is None or split == state.get("_split"), SourceError,
                f"split={split!r} but the directory holds one Dataset (split {state.get('_split')!r}), not a "
                "DatasetDict; leave split out")
        entries = state.get("_data_files")
        require(isinstance(entries, list) and bool(entries), SourceError,
                "state.json lists no _data_files; the directory is damaged: save it again")
        names = [e.get("filename") if isinstance(e, dict) else None for e in entries]
        for name in names:
            require(isinstance(name, str) and name in listing, SourceError,
                    f"state.json names the data file {name!r}, which is not in the directory; it is incomplete: "
                    "save it again")
        return [str(name) for name in names]
    require("dataset_info.json" in listing, SourceError,
            "the directory holds no dataset_dict.json, state.json or dataset_info.json: it is neither a save_to_disk "
            "directory nor a load_dataset cache; pass such a directory, or the data files themselves")
    shards = cache_shards(sorted(name for name in listing if "/" not in name))
    require(bool(shards), SourceError, "the load_dataset cache directory holds no <builder>-<split>.arrow file; "
            "run load_dataset to completion, or pass the data files themselves")
    if split is None:
        require(len(shards) == 1, SourceError,
                f"the load_dataset cache holds splits {sorted(shards)}; pass split=<one of them>")
        split = next(iter(shards))
    require(split in shards, SourceError,
            f"split={split!r} is not in the load_dataset cache, which holds splits {sorted(shards)}; pass one of them")
    return shards[split]
