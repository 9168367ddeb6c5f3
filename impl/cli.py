"""The ``loadspec`` command: build a store, preview samples, audit a config.

Why a CLI: the questions a team asks before a weeks-long run ("what exactly
will the model see?", "will a resume on another number of GPUs repeat or drop
anything?") should be answerable in one command, on the real data, before the
first GPU hour is spent.

    loadspec build data/ store/ --tokenizer fixtures/tokenizer/gpt2
    loadspec preview store/ --seq-len 2048 --packing best_fit -n 2 --split "train[:90%]"
    loadspec check store/ --seq-len 2048 --world-sizes 8,6,16 --resumes 5
    loadspec check web/ code/ --weights 0.7 0.3 --stopping all_exhausted --seq-len 2048
    loadspec preview store/ --seq-len 2048 --packing none --bucket 256,8

The demos (a DDP job resumed on another world size, a two-corpus mixture)
are not commands: they run on the repository's ``fixtures/``, which a wheel
does not ship, so they live in the checkout's ``demos/`` (``make demo``,
``make demo-mix``).

Why every heavy import is inside a command: ``--help``, ``<command> --help``
and a usage error must answer at once, so this module imports only the
standard library, ``impl.errors`` and the stdlib-only ``reference`` parsers;
torch and the datasets load when a command runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from impl.errors import ConfigError, LoadspecError
from reference.mixing import STOPPING_STRATEGIES


def _int_at_least(low: int) -> Any:
    """An argparse ``type`` for integers >= ``low``: a bad value is a usage error (exit 2), not a traceback."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (expected an integer >= {low})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: expected an integer >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _world_sizes(text: str) -> list[int]:
    """``--world-sizes 8,6,16``: comma-separated integers >= 1."""
    parts = [t.strip() for t in text.split(",")]
    sizes = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r}: {part!r} is not a world size; pass comma-separated integers >= 1, e.g. 2,3,8"
            )
        sizes.append(int(part))
    return sizes


def _split(text: str) -> str:
    """``--split "train[:90%]"``: split notation as ``PackedDataset(split=...)`` takes it (checked here, resolved there)."""
    from reference.errors import SplitError
    from reference.splits import parse_bounds

    try:
        parse_bounds(text)
    except SplitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _weight(text: str) -> float:
    """One ``--weights`` entry: a finite number >= 0 (relative; the weights need not sum to 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; pass one relative weight per store, "
                                         "e.g. --weights 0.7 0.3") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a weight must be a finite number >= 0, e.g. --weights 0.7 0.3")
    return value


def _bucket(text: str) -> tuple[int, int]:
    """``--bucket BUFFER,PACK``: ``BufferSortedDataset(buffer_size=BUFFER, pack_size=PACK)``, PACK <= BUFFER."""
    parts = [t.strip() for t in text.split(",")]
    if len(parts) != 2 or not all(t.isdigit() and int(t) >= 1 for t in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not BUFFER,PACK; pass two integers >= 1, e.g. --bucket 256,8 "
                                         "(sort 256 samples at a time by length, in packs of 8)")
    buffer_size, pack_size = int(parts[0]), int(parts[1])
    if pack_size > buffer_size:
        raise argparse.ArgumentTypeError(f"{text!r}: the pack size {pack_size} exceeds the buffer size {buffer_size}; "
                                         "a pack is cut from one buffer, so pass PACK <= BUFFER, e.g. "
                                         f"--bucket {pack_size},{pack_size} or --bucket {buffer_size},{buffer_size}")
    return buffer_size, pack_size


def _storage_option(text: str) -> tuple[str, Any]:
    """``--storage-option KEY=VALUE``: one fsspec storage option; VALUE is JSON when it parses as JSON, else text.

    >>> _storage_option("endpoint_url=http://127.0.0.1:9000"), _storage_option('client_kwargs={"region_name": "eu"}')
    (('endpoint_url', 'http://127.0.0.1:9000'), ('client_kwargs', {'region_name': 'eu'}))
    """
    import json

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE; pass e.g. --storage-option "
                                         "endpoint_url=http://127.0.0.1:9000")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def _add_dataset_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", type=Path, nargs="+",
                   help="a directory written by `loadspec build`; several stores are mixed (see --weights)")
    p.add_argument("--seq-len", type=_int_at_least(1), required=True)
    p.add_argument("--packing", default="concat", choices=["concat", "chunk", "greedy", "first_fit", "best_fit", "none"])
    p.add_argument("--shuffle", default="none", choices=["none", "global", "window"])
    p.add_argument("--window", type=_int_at_least(1), default=1024, help="window size of the window shuffle")
    p.add_argument("--pack-window", type=_int_at_least(1), default=1000, help="documents per bin-packing window")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--epoch", type=_int_at_least(0), default=0)
    p.add_argument("--split", type=_split, default=None,
                   help='read only these documents of each store, e.g. "train[:90%%]" (PackedDataset split=)')
    mix = p.add_argument_group("mixing several stores (MixedDataset)")
    mix.add_argument("--weights", type=_weight, nargs="+", default=None,
                     help="one relative weight per store, e.g. 0.7 0.3 (default: round robin)")
    mix.add_argument("--stopping", default="first_exhausted", choices=list(STOPPING_STRATEGIES),
                     help="when the mixed epoch ends (all_exhausted: every sample once)")
    mix.add_argument("--mix-seed", type=_int_at_least(0), default=0, help="seed of the weighted draws")
    p.add_argument("--bucket", type=_bucket, default=None, metavar="BUFFER,PACK",
                   help="length bucketing (BufferSortedDataset): sort BUFFER samples at a time by length and serve "
                        "them in shuffled packs of PACK, e.g. 256,8")


def _check_dataset_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors that need two options at once (argparse checks one value at a time)."""
    stores = len(args.store)
    if args.weights is not None and len(args.weights) != stores:
        parser.error(f"--weights has {len(args.weights)} value(s) but {stores} store(s) were given; pass one weight "
                     "per store, in the stores' order")
    if args.weights is not None and sum(args.weights) <= 0:
        parser.error("--weights are all 0; give at least one store a weight > 0")
    if stores == 1 and (args.weights is not None or args.stopping != "first_exhausted" or args.mix_seed != 0):
        parser.error("--weights, --stopping and --mix-seed apply to a mixture; pass two or more stores, or drop them")


def _dataset(args: argparse.Namespace) -> Any:
    """The dataset the options describe: a PackedDataset per store, mixed when several, bucketed with --bucket."""
    from impl.dataset import PackedDataset

    datasets = [PackedDataset(store, seq_len=args.seq_len, packing=args.packing, shuffle=args.shuffle,
                              window=args.window, pack_window=args.pack_window, seed=args.seed, epoch=args.epoch,
                              split=args.split) for store in args.store]
    ds: Any = datasets[0]
    if len(datasets) > 1:
        from impl.mixed_dataset import MixedDataset

        ds = MixedDataset(datasets, weights=args.weights, stopping=args.stopping, seed=args.mix_seed, epoch=args.epoch)
    if args.bucket is not None:
        from impl.bucketing import BufferSortedDataset

        buffer_size, pack_size = args.bucket
        ds = BufferSortedDataset(_Samples(ds, args.epoch), buffer_size, pack_size, init_seed=args.seed,
                                 epoch=args.epoch)
    return ds


def _samples(ds: Any, epoch: int, indices: list[int]) -> dict[str, Any]:
    """Samples ``indices`` of ``epoch`` as stacked numpy arrays, whatever ``_dataset`` built."""
    base = getattr(ds, "base_dataset", None)
    if isinstance(base, _Samples):
        return _samples(base.dataset, epoch, [ds.index_at(epoch, i) for i in indices])
    return dict(ds.samples(epoch, indices))


def _sample(ds: Any, epoch: int, index: int) -> dict[str, Any]:
    return {name: value[0] for name, value in _samples(ds, epoch, [index]).items() if hasattr(value, "__len__")}


class _Samples:
    """A packed or mixed dataset of one epoch with ``sort_key`` (its real tokens), as ``BufferSortedDataset`` needs.

    Lengths are read a block of samples at a time (``samples``), once.
    """

    BLOCK = 1024

    def __init__(self, dataset: Any, epoch: int) -> None:
        self.dataset, self.epoch = dataset, epoch
        self.fingerprint = f"{dataset.fingerprint}:epoch={epoch}"
        self._lengths: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return int(self.dataset.num_samples(self.epoch))

    def __getitem__(self, index: int) -> Any:
        from impl.keys import SampleKey

        return self.dataset[SampleKey(self.epoch, int(index))]

    def sort_key(self, index: int) -> int:
        block = index // self.BLOCK
        if block not in self._lengths:
            rows = list(range(block * self.BLOCK, min(len(self), (block + 1) * self.BLOCK)))
            self._lengths[block] = (self.dataset.samples(self.epoch, rows)["doc_ids"] >= 0).sum(axis=1).tolist()
        return self._lengths[block][index - block * self.BLOCK]


def cmd_build(args: argparse.Namespace) -> int:
    from impl.store import TokenStore

    if args.commit:
        from impl.build_tasks import commit_build

        out = args.source if args.out is None else args.out
        store = commit_build(out, tasks=args.tasks, storage_options=dict(args.storage_option) or None)
        print(f"committed store {store.path}: {len(store)} documents, {store.num_tokens} tokens ({store.dtype}), "
              f"fingerprint {store.fingerprint[:16]}")
        return 0
    if args.out is None or args.tokenizer is None:
        raise ConfigError("loadspec build needs SOURCE OUT --tokenizer T (or --commit OUT)")
    if args.storage_option and args.task is None and args.tasks is None and not args.task_from_env:
        raise ConfigError("--storage-option applies to a multi-task build into a URL (--task I --tasks N or "
                          "--task-from-env, then --commit); a local build writes a local OUT")
    if args.task is not None or args.tasks is not None or args.task_from_env:
        from impl.build_tasks import build_task

        if args.task_from_env and (args.task is not None or args.tasks is not None):
            raise ConfigError("pass either --task I --tasks N or --task-from-env, not both")
        if not args.task_from_env and (args.task is None or args.tasks is None):
            raise ConfigError("pass both --task I and --tasks N (or --task-from-env under torchrun / a Slurm array)")
        result = build_task(args.source, args.tokenizer, args.out, task=args.task, tasks=args.tasks,
                            text_field=args.text_field, add_bos=args.add_bos, add_eos=not args.no_eos,
                            split=args.split, progress=True, commit_when_done=args.commit_when_done,
                            storage_options=dict(args.storage_option) or None)
        from impl.remote import redact_url

        done = "already done (its fragment validates), skipped" if result.skipped else "done"
        shown = redact_url(args.out)
        if result.committed:
            print(f"task {result.task} of {result.tasks}: {len(result.files)} files, {done}; it was the last task "
                  f"and committed the store {shown}")
        elif args.commit_when_done:
            print(f"task {result.task} of {result.tasks}: {len(result.files)} files, {done}; the last task to "
                  "finish commits the store")
        else:
            print(f"task {result.task} of {result.tasks}: {len(result.files)} files, {done}; when every task is "
                  f"done: loadspec build --commit {shown}")
        return 0
    store = TokenStore.build(args.source, args.tokenizer, args.out, text_field=args.text_field, num_proc=args.num_proc,
                             add_bos=args.add_bos, add_eos=not args.no_eos, split=args.split, overwrite=args.overwrite,
                             progress=True)
    print(f"store {store.path}: {len(store)} documents, {store.num_tokens} tokens ({store.dtype}), "
          f"fingerprint {store.fingerprint[:16]}")
    return 0


def _render(sample: dict[str, Any], decode: Callable[[int], Any]) -> str:
    """Tokens with ⟦doc d @offset⟧ at every segment start, labels masked (-100) shown as ‹…›, padding as ·."""
    out = []
    ids, labels, docs, offsets, pos = (sample[k].tolist() for k in ("input_ids", "labels", "doc_ids", "token_offsets",
                                                                   "position_ids"))
    for j, tok in enumerate(ids):
        if docs[j] < 0:
            out.append("·")
            continue
        if pos[j] == 0:
            out.append(f"⟦doc {docs[j]} @{offsets[j]}⟧")
        text = decode(tok)
        out.append(f"‹{text}›" if labels[j] == -100 else text)
    return "".join(out)


def cmd_preview(args: argparse.Namespace) -> int:
    ds = _dataset(args)
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
        decode = lambda t: tok.decode([t])
    else:
        decode = lambda t: f" {t}"
    total = ds.num_samples(args.epoch)
    print(f"{ds!r}: {total} samples in epoch {args.epoch}" + _described_split(args))
    _print_mixture(ds, args)
    pack = args.bucket[1] if args.bucket else 0
    shown = min(args.n, total)
    for i in range(shown):
        if pack and i % pack == 0:
            rows = list(range(i, min(total, i + pack)))
            lengths = (_samples(ds, args.epoch, rows)["doc_ids"] >= 0).sum(axis=1).tolist()
            print(f"══ pack {i // pack} (samples {rows[0]}..{rows[-1]}): lengths {lengths}")
        sample = _sample(ds, args.epoch, i)
        masked = int((sample["labels"] == -100).sum())
        pad = int((sample["doc_ids"] < 0).sum())
        starts = [int(j) for j in (sample["position_ids"] == 0).nonzero()[0] if sample["doc_ids"][j] >= 0]
        origin = f" from store {int(sample['source'])}" if "source" in sample else ""
        print(f"── sample {i}{origin}: segments at {starts}, {masked} labels masked, {pad} padding")
        print(_render(sample, decode))
    return 0


def _described_split(args: argparse.Namespace) -> str:
    return f", split {args.split!r} of each store" if args.split else ""


def _print_mixture(ds: Any, args: argparse.Namespace) -> None:
    """One line per store of a mixture: its samples in the epoch and its share of the mixed stream."""
    mixed = getattr(ds, "base_dataset", None)
    mixed = mixed.dataset if isinstance(mixed, _Samples) else ds
    if not hasattr(mixed, "source_sizes"):
        return
    import numpy as np

    counts = np.bincount(mixed.plan(args.epoch).source, minlength=len(args.store)).tolist()
    total = max(1, sum(counts))
    sizes = mixed.source_sizes(args.epoch)
    weights = args.weights or [None] * len(args.store)
    for k, (store, size, count, weight) in enumerate(zip(args.store, sizes, counts, weights)):
        share = "round robin" if weight is None else f"weight {weight:g}"
        print(f"  mixture store {k} {store}: {share}, {count} of its {size} samples, {count / total:.1%} of the "
              f"mixed epoch")


def cmd_check(args: argparse.Namespace) -> int:
    """Simulate topologies with resumes at random points; audit coverage and exact continuation.

    Coverage is computed from the partition arithmetic over every rank; continuation is checked for
    real: at each resume a fresh dataset and loader (as in a new process) load the state, and their
    first batch must equal the uninterrupted stream's samples at the same global positions.
    """
    import numpy as np

    from impl import rng
    from impl.loader import build_dataloader
    from impl.partition import advance, group_batch, trained_end
    from impl.resume import audit_coverage
    from impl.store import TokenStore
    from reference.partition import PartitionConfig
    from reference.resume import make_state

    for path in args.store:
        store = TokenStore.open(path, verify=args.verify)
        print(f"store {store.path}: {len(store)} documents, {store.num_tokens} tokens; files checked by "
              f"{'full sha256' if args.verify else 'size, and quick signatures as files are first read'}")
    ds = _dataset(args)
    total = ds.num_samples(args.epoch)
    print(f"{ds!r}" + _described_split(args))
    _print_mixture(ds, args)
    worlds = args.world_sizes
    configs = [PartitionConfig(world_size=w, batch_size=args.batch_size) for w in worlds]
    key = rng.derive_key(args.seed, args.epoch, rng.Stream.SAMPLE_ORDER)
    print(f"epoch {args.epoch}: {total} samples; topologies {worlds} × batch {args.batch_size}, {args.resumes} resumes")
    consumed, seen, failures = 0, [], []
    for segment in range(args.resumes + 1):
        cfg = configs[segment % len(configs)]
        if segment:
            fresh = build_dataloader(_dataset(args), batch_size=args.batch_size, rank=0, world_size=cfg.world_size)
            fresh.load_state_dict(make_state(ds.fingerprint, args.epoch, consumed))
            first = next(iter(fresh), None)
            expected = group_batch(consumed, total, cfg, 0)
            if first is None and expected:
                failures.append(f"resume at sample {consumed} on {cfg.world_size} ranks yielded nothing")
            elif first is not None:
                want = _samples(ds, args.epoch, expected)["input_ids"]
                if first["input_ids"].numpy().tolist() != want.tolist():
                    failures.append(f"resume at sample {consumed} on {cfg.world_size} ranks did not continue the stream")
        last = segment == args.resumes
        span = max(1, total // (cfg.global_batch_size * (args.resumes + 1)))
        steps = 1 << 62 if last else 1 + int(rng.below(key, np.array([segment]), span)[0])
        before = consumed
        for _ in range(steps):
            groups = [group_batch(consumed, total, cfg, g) for g in range(cfg.data_parallel_size)]
            seen += [i for g in groups for i in g]
            consumed = advance(consumed, total, cfg)  # also after the empty step that ends the epoch (PART-7)
            if not any(groups):
                break
        ended = consumed >= total
        end = trained_end(before, total, cfg) if ended else consumed
        print(f"  {cfg.world_size} ranks: samples [{before}, {end})" + (" → end of epoch" if ended else " → checkpoint, resume"))
        if ended:
            break
    audit = audit_coverage(seen, end)
    audited = min(total, args.audit_samples)
    tokens = int((_samples(ds, args.epoch, list(range(audited)))["doc_ids"] >= 0).sum()) if audited else 0
    print(f"coverage: {audit.trained} samples trained of {total}, duplicates {audit.duplicates}, "
          f"missing {audit.missing}, past the trained range {audit.beyond_end}, left at the epoch's end {total - end}")
    print(f"utilisation over the first {audited} samples: {tokens / max(1, audited * args.seq_len):.1%}")
    for f in failures:
        print("FAILED:", f)
    ok = not failures and audit.exact
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadspec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="tokenize a dataset into a token store (with a progress bar)")
    b.add_argument("source", help="files, a directory, a save_to_disk directory, or a load_dataset cache")
    b.add_argument("out", nargs="?", default=None, help="a directory, or with --task/--commit an fsspec URL "
                   "(s3://bucket/store)")
    b.add_argument("--tokenizer", default=None, help="a tokenizer directory or tokenizer.json (required to tokenize)")
    b.add_argument("--text-field", default="text")
    b.add_argument("--split", default=None)
    b.add_argument("--num-proc", type=_int_at_least(1), default=None)
    b.add_argument("--add-bos", action="store_true")
    b.add_argument("--no-eos", action="store_true")
    b.add_argument("--overwrite", action="store_true")
    b.add_argument("--task", type=_int_at_least(0), default=None, help="this task's index (with --tasks)")
    b.add_argument("--tasks", type=_int_at_least(1), default=None,
                   help="tokenize only task --task of this many into OUT's staging area (then --commit)")
    b.add_argument("--task-from-env", action="store_true",
                   help="take --task/--tasks from torchrun (RANK, WORLD_SIZE) or a Slurm array")
    b.add_argument("--commit-when-done", action="store_true",
                   help="with --task/--task-from-env: the last task to finish commits the store (no --commit step)")
    b.add_argument("--commit", action="store_true",
                   help="validate the tasks' fragments and publish the store at OUT (loadspec build --commit OUT)")
    b.add_argument("--storage-option", type=_storage_option, action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec storage option for a URL OUT (repeatable; VALUE is JSON when it parses), e.g. "
                        "endpoint_url=http://minio:9000; credentials are best left to the environment")
    b.set_defaults(fn=cmd_build)

    p = sub.add_parser("preview", help="decode the first samples, marking document boundaries and masked labels")
    _add_dataset_options(p)
    p.add_argument("-n", type=_int_at_least(0), default=2)
    p.add_argument("--tokenizer", type=Path, default=None)
    p.set_defaults(fn=cmd_preview)

    c = sub.add_parser("check", help="audit a store and config: simulated ranks, resumes, exactly-once coverage")
    _add_dataset_options(c)
    c.add_argument("--world-sizes", type=_world_sizes, default=[2, 3], help="topologies to cycle through at each resume")
    c.add_argument("--batch-size", type=_int_at_least(1), default=1)
    c.add_argument("--resumes", type=_int_at_least(0), default=4)
    c.add_argument("--audit-samples", type=_int_at_least(0), default=200)
    c.add_argument("--verify", action="store_true", help="recompute every file's sha256")
    c.set_defaults(fn=cmd_check)

    args = parser.parse_args(argv)  # a bad flag or value: usage on stderr, SystemExit(2)
    if args.command in ("preview", "check"):
        _check_dataset_args(sub.choices[args.command], args)
    try:
        return int(args.fn(args))
    except LoadspecError as exc:
        print(f"loadspec {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"loadspec {args.command}: {type(exc).__name__}: {exc} (check the path, its permissions and free "
              "space)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"loadspec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
