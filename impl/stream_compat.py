"""KempnerForge's and Forgather's streaming constructors, mapped onto :class:`impl.streaming.StreamingDataset`.

Why: teams come from these loaders with configs that name their options;
where a name means what a loadspec option means, it is accepted as is, and
where loadspec's meaning differs the call is refused with the loadspec way
(``ConfigError`` / ``TopologyError``), never approximated silently.

- :func:`StreamingHuggingFaceDataset`: KempnerForge's ``hf_*`` fields, with
  ``hf_dataset_name`` a local file, glob or data directory (no download).
  ``shuffle_buffer_size`` (default 10,000) is STREAM-8's buffer, keyed by
  ``(seed, epoch)`` as KempnerForge's ``seed + epoch``; unlike it, the state
  resumes the buffer exactly and on another world size (STREAM-15).
- :func:`fast_load_iterable_dataset`: Forgather's, returning a
  :class:`FastIterableDataset` with ``shuffle(seed, buffer_size)``,
  ``set_epoch``, ``shard(num_shards, index, mode=...)`` (a shard is a rank
  owning whole lanes, STREAM-10), ``map(function, batched=..., batch_size=...,
  remove_columns=...)`` (STREAM-20, Hugging Face's column meaning) and
  ``state_dict`` / ``load_state_dict``, which resume inside a mapped batch (STREAM-21).

Worked example::

    ds = StreamingHuggingFaceDataset(hf_dataset_name="data/", hf_dataset_split="train",
                                     tokenizer_path="fixtures/tokenizer/gpt2", seq_len=2048)
    it = fast_load_iterable_dataset("data/", split="train", tokenizer="fixtures/tokenizer/gpt2", seq_len=2048,
                                    num_lanes=8).shuffle(seed=1, buffer_size=1000).shard(2, 0)

    # Forgather's block tokenizer: a batch of 1000 texts to blocks of 2048 token ids (N to M)
    def block_tokenize(batch):                  # module level, so workers under spawn can unpickle it
        ids = [t for enc in tok.encode_batch(batch["text"]) for t in enc.ids + [EOS]]
        return {"input_ids": [ids[i:i + 2048] for i in range(0, len(ids) - 2047, 2048)]}

    blocks = fast_load_iterable_dataset("data/", split="train", tokenizer="fixtures/tokenizer/gpt2", seq_len=2048,
                                        add_eos=False, num_lanes=8).map(block_tokenize, batched=True,
                                                                        batch_size=1000, remove_columns=["text"])
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping
from typing import Any

from impl.errors import ConfigError, MapError, SourceError, TopologyError, require
from impl.hf_sources import directory_files
from impl.stream_lanes import valid_world_sizes
from impl.streaming import StreamingDataset
from impl.units import KNOWN, file_format

__all__ = ["FastIterableDataset", "HFMap", "StreamingHuggingFaceDataset", "fast_load_iterable_dataset"]

_SHARD_MODES = ("auto", "file", "example")


def _data_files(name: str, config: str | None, split: str | None) -> list[str]:
    """The files a local dataset name holds: a file or glob as given; a directory's files of known kinds.

    A ``save_to_disk`` directory or a ``load_dataset`` cache gives its split's
    files in the order its metadata names them (STREAM-19). In another
    directory (``config`` its sub-directory), files whose path names the
    split (``train-0000.parquet``, ``train/x.jsonl``) are taken when there are
    any, else every file.
    """
    if not os.path.isdir(name):
        require(config is None, ConfigError, f"hf_dataset_config={config!r} names a sub-directory of a data "
                f"directory, but {name!r} is not a directory: leave it out or pass the directory")
        return [name]
    root = os.path.join(name, config) if config else name
    require(os.path.isdir(root), SourceError, f"{root} does not exist: hf_dataset_config names a sub-directory")
    if os.path.isfile(os.path.join(root, "state.json")):      # one saved Dataset: its own files, whatever the split
        return directory_files(root, None)
    if any(os.path.isfile(os.path.join(root, f)) for f in ("dataset_dict.json", "dataset_info.json")):
        return directory_files(root, split)                   # a saved DatasetDict or a load_dataset cache (STREAM-19)
    found = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        rel = os.path.relpath(path, root)
        if os.path.isfile(path) and not any(part.startswith(".") for part in rel.split(os.sep)):
            try:
                file_format(path)
            except SourceError:
                continue
            found.append(path)
    require(bool(found), SourceError, f"{root} holds no {KNOWN} file: pass a directory of such files (Hugging Face "
            "hub downloads need the files on local disk)")
    named = [p for p in found if split and split in os.path.relpath(p, root)]
    return named or found


def StreamingHuggingFaceDataset(*, hf_dataset_name: str, tokenizer_path: Any, seq_len: int,
                                hf_dataset_config: str | None = None, hf_dataset_split: str | None = "train",
                                hf_dataset_text_field: str = "text", shuffle_buffer_size: int = 10_000,
                                seed: int = 0, pack_sequences: bool = True, **options: Any) -> StreamingDataset:
    """A :class:`StreamingDataset` from KempnerForge's ``StreamingHuggingFaceDataset`` arguments.

    ``options`` are :class:`StreamingDataset`'s own (``num_lanes``,
    ``batch_size``, ``rank``, ``world_size``, ``index_dir``, ...).
    ``pack_sequences=False`` (one padded document per sample) is refused:
    a stream packs (STREAM-9).
    """
    require(pack_sequences is True, ConfigError,
            "pack_sequences=False (one padded document per sample) has no streaming form: streaming samples are "
            "packed (packing='concat' or 'chunk'); for one document per sample build a TokenStore and use "
            "PackedDataset(..., packing='none')")
    for name in ("split", "streaming", "shuffle"):
        require(name not in options, ConfigError, f"{name}= is not a StreamingHuggingFaceDataset option; use "
                "hf_dataset_split / shuffle_buffer_size (a stream is always streamed)")
    return StreamingDataset(_data_files(hf_dataset_name, hf_dataset_config, hf_dataset_split),
                            tokenizer=tokenizer_path, seq_len=seq_len, text_field=hf_dataset_text_field,
                            shuffle=shuffle_buffer_size > 1, shuffle_buffer_size=shuffle_buffer_size, seed=seed,
                            **options)


class FastIterableDataset:
    """Forgather's iterable-dataset calls over a :class:`StreamingDataset` built when first iterated.

    ``shuffle``, ``shard`` and ``map`` return a new object (as Forgather's
    do); the dataset behind it is :attr:`dataset`. ``slice`` and ``select``
    are refused with the loadspec way.
    """

    def __init__(self, paths: list[str], options: Mapping[str, Any],
                 mapping: tuple[HFMap, int, str] | None = None) -> None:
        self._paths, self._options, self._map = paths, dict(options), mapping
        self._dataset: StreamingDataset | None = None

    def _with(self, **changes: Any) -> FastIterableDataset:
        return FastIterableDataset(self._paths, {**self._options, **changes}, self._map)

    @property
    def dataset(self) -> StreamingDataset:
        if self._dataset is None:
            ds = StreamingDataset(self._paths, **self._options)
            if self._map is not None:
                fn, batch_size, name = self._map
                ds = ds.map(fn, batched=True, batch_size=batch_size, name=name)
            self._dataset = ds
        return self._dataset

    def shuffle(self, seed: int = 0, buffer_size: int = 1000) -> FastIterableDataset:
        """Unit order, rows and a buffer of ``buffer_size`` rows shuffled per ``(seed, epoch)`` (STREAM-6 .. 8)."""
        return self._with(shuffle=True, seed=seed, shuffle_buffer_size=buffer_size)

    def shard(self, num_shards: int, index: int, mode: str = "auto") -> FastIterableDataset:
        """Shard ``index`` of ``num_shards``: a rank of that world size owning whole lanes (STREAM-10).

        Every mode means the same here (a lane holds whole units, its rows
        in a keyed order); ``num_shards`` must divide ``num_lanes``.
        """
        require(mode in _SHARD_MODES, ConfigError, f"mode={mode!r} must be one of {_SHARD_MODES}")
        lanes = int(self._options.get("num_lanes", 1))
        require(lanes % num_shards == 0, TopologyError,
                f"shard(num_shards={num_shards}, mode={mode!r}) cannot split num_lanes={lanes} into whole lanes: "
                f"loadspec shards by lanes so that a checkpoint resumes on another world size; choose num_shards in "
                f"{valid_world_sizes(lanes)} or pass num_lanes=<a multiple of {num_shards}> to "
                "fast_load_iterable_dataset")
        return self._with(rank=index, world_size=num_shards)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.dataset)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dataset.load_state_dict(state)

    def slice(self, *args: Any, **kwargs: Any) -> FastIterableDataset:
        raise ConfigError("slice() cuts a stream by example position, which a lane-sharded stream does not have; "
                          "select files with paths (a list or glob), or build a TokenStore and use "
                          "impl.splits for a split by documents")

    def select(self, *args: Any, **kwargs: Any) -> FastIterableDataset:
        raise ConfigError("select(range) picks examples by position, which a lane-sharded stream does not have; "
                          "select files with paths, or build a TokenStore and use impl.splits.slice_store")

    def map(self, function: Any, with_indices: bool = False, input_columns: Any = None, batched: bool = False,
            batch_size: int | None = 1000, drop_last_batch: bool = False, remove_columns: str | list[str] | None = None,
            features: Any = None, fn_kwargs: Mapping[str, Any] | None = None, *,
            name: str | None = None) -> FastIterableDataset:
        """Each lane's rows through ``function`` in input batches, as Hugging Face's ``map`` means it (STREAM-20).

        ``batched=True``: ``function({"text": [text, ...]})`` returns a dict
        of equal-length column lists, any number M of outputs (a block
        tokenizer); ``batched=False``: one example dict in, one out. As in
        Hugging Face, the input ``text`` column stays in the output unless
        ``remove_columns`` names it (an output of M != N rows then needs it
        removed); the lane packs ``input_ids`` when the output has them, else
        tokenizes ``text``. ``name`` (a loadspec addition) names the map in the
        state (default the function's ``module.qualname``). The arguments whose
        meaning needs an example index or other call shape are refused.
        """
        text_field = str(self._options.get("text_field", "text"))
        refused = {"with_indices": (with_indices, "a lane-sharded stream has no example index to pass"),
                   "input_columns": (input_columns, "the function receives the batch dict; read the column there"),
                   "drop_last_batch": (drop_last_batch, "each lane maps its short last batch too (STREAM-20)"),
                   "features": (features, "the lane packs input_ids or tokenizes text; leave features out"),
                   "fn_kwargs": (fn_kwargs, "pass functools.partial(function, **fn_kwargs) with name='<map>-v1'")}
        for arg, (value, fix) in refused.items():
            require(not value, ConfigError, f"map({arg}={value!r}) has no streaming form: {fix}")
        require(self._map is None, ConfigError,
                "this dataset is already mapped: a stream takes one map; compose the functions into one")
        require(callable(function), ConfigError, f"function={function!r} must be callable")
        require(not batched or (isinstance(batch_size, int) and batch_size >= 1), ConfigError,
                f"batch_size={batch_size!r} must be an integer >= 1 (batch_size=None, one batch of everything, has no "
                "streaming form)")
        removed = (remove_columns,) if isinstance(remove_columns, str) else tuple(remove_columns or ())
        ident = name or f"{getattr(function, '__module__', None) or '?'}.{getattr(function, '__qualname__', '?')}"
        fn = HFMap(function, text_field, removed, batched)
        return FastIterableDataset(self._paths, self._options, (fn, int(batch_size or 1) if batched else 1, ident))


class HFMap:
    """Hugging Face's ``map`` column meaning as a batched map: the input text column kept unless removed.

    A module-level class, so it pickles for workers whenever ``function`` does.
    """

    def __init__(self, function: Any, text_field: str, removed: tuple[str, ...], batched: bool) -> None:
        self.function, self.text_field, self.removed, self.batched = function, text_field, removed, batched

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        texts = batch[self.text_field]
        name = getattr(self.function, "__qualname__", repr(self.function))
        if self.batched:
            result = self.function({self.text_field: list(texts)})
            require(isinstance(result, Mapping), MapError, f"the map {name!r} returned {type(result).__name__}, not "
                    "a dict of columns: return {'input_ids': [[id, ...], ...]} or {'text': [text, ...]}")
            out = dict(result)
        else:
            out = {}
            for text in texts:
                one = self.function({self.text_field: text})
                require(isinstance(one, Mapping), MapError, f"the map {name!r} (batched=False) returned "
                        f"{type(one).__name__}, not a dict: return one example; for N to M use batched=True")
                for key, value in one.items():
                    out.setdefault(key, []).append(value)
        if self.text_field not in self.removed and self.text_field not in out:
            sizes = {str(k): len(v) for k, v in out.items() if isinstance(v, (list, tuple))}
            require(set(sizes.values()) <= {len(texts)}, MapError,
                    f"the map {name!r} returned {sizes} outputs for {len(texts)} input rows while keeping the input "
                    f"column {self.text_field!r}: pass remove_columns=[{self.text_field!r}] (as Hugging Face needs "
                    "too)")
            out[self.text_field] = list(texts)
        return out


def fast_load_iterable_dataset(path: str, split: str | None = "train", index_dir: str | None = None,
                               **options: Any) -> FastIterableDataset:
    """Forgather's ``fast_load_iterable_dataset`` over local files: ``path`` a file, glob or data directory.

    ``options`` are :class:`StreamingDataset`'s (``tokenizer`` and
    ``seq_len`` required). A split with a slice (``"train[10000:]"``) is
    refused: a stream has no example positions.
    """
    require(split is None or "[" not in split, ConfigError,
            f"split={split!r} slices examples by position, which a lane-sharded stream does not have; pass "
            "split='train' and select files with the path, or build a TokenStore and use impl.splits.slice_store")
    return FastIterableDataset(_data_files(path, None, split), dict(options, index_dir=index_dir))
