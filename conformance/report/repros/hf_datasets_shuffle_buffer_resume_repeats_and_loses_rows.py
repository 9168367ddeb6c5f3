"""HF datasets: resuming ``shuffle(buffer_size)`` from a state taken past the buffer's first half repeats and loses rows.

The state rewinds the rebatching layer to a saved inner position and skips
the rows it already yielded. Within the first ``buffer_size // 2 + 1`` rows
that position is the start of the stream and the replay is exact; after
that it is the reader's position, past the rows the buffer held, and the
buffer restarts empty (the "without the buffer content" warning): rows in it
are lost (documented) and rows already trained come out again (not
documented). No process, rank, worker or torchdata is needed. The kit's
setting (2 ranks of ``split_dataset_by_node``, 4 shards, buffer 16,
``StatefulDataLoader`` batches of 2, jobs of 4, 4 and the rest steps) resumes
exactly from its first checkpoint (8 rows per rank, within 9) and not from
its second (16 rows), hence "also when restarted twice"; one restart after 16 rows fails the same.
Exact any number of times: ``buffer_size=1`` (shard order only) or
``Dataset.shuffle(seed)`` before ``to_iterable_dataset``.
Upstream: huggingface/datasets issue 7901; pull request 8408 (open) saves the buffer in the state.

Run: .venv-bench/bin/python conformance/report/repros/hf_datasets_shuffle_buffer_resume_repeats_and_loses_rows.py
"""

import functools
import itertools
import json
import logging

from datasets import Dataset
from datasets.distributed import split_dataset_by_node
from torchdata.stateful_dataloader import StatefulDataLoader

logging.getLogger("datasets").setLevel(logging.ERROR)  # the buffer warning, once per resume


def rows(n, *, shards=1, buffer=4, map_shuffle=False, rank=0, world=1):
    table = Dataset.from_dict({"x": list(range(n))})
    if map_shuffle:
        table = table.shuffle(seed=0)
    ds = table.to_iterable_dataset(num_shards=shards)
    if buffer:
        ds = ds.shuffle(seed=0, buffer_size=buffer)
    return split_dataset_by_node(ds, rank=rank, world_size=world) if world > 1 else ds


def restarted(build, stops, *, loader=False):
    """Each run a new object: load the last run's state (through JSON), take ``stop`` items (None: the rest)."""
    out, state = [], None
    for stop in [*stops, None]:
        ds = build()
        obj = StatefulDataLoader(ds, batch_size=2, drop_last=True, collate_fn=lambda b: [r["x"] for r in b]) \
            if loader else ds
        if state is not None:
            obj.load_state_dict(state)
        out += [b if loader else b["x"] for b in itertools.islice(iter(obj), stop)]
        state = json.loads(json.dumps(obj.state_dict()))
    return out


def flat(stream):
    return [x for b in stream for x in (b if isinstance(b, list) else [b])]


def report(what, build, stops, **kw):
    whole, got = restarted(build, [], **kw), restarted(build, stops, **kw)
    if got == whole:
        print(f"{what}, stopped after {stops} then the rest: exact")
        return
    twice = sorted({x for x in flat(got) if flat(got).count(x) > 1})
    lost = sorted(set(flat(whole)) - set(flat(got)))
    print(f"{what}, stopped after {stops} then the rest:\n  uninterrupted {whole}\n  restarted     {got}\n"
          f"  trained twice {twice}, never trained {lost}")


for buffer in (4, 8, 16):
    build = functools.partial(rows, 200, buffer=buffer)
    whole = restarted(build, [])
    exact = [k for k in range(1, 40) if restarted(build, [k]) == whole]
    print(f"200 rows, 1 shard, buffer {buffer}: one resume after k rows is exact for k in {exact} (of 1..39)")
report("20 rows, 1 shard, buffer 4", functools.partial(rows, 20), [3])
report("20 rows, 1 shard, buffer 4", functools.partial(rows, 20), [4])
report("20 rows, 1 shard, buffer 4", functools.partial(rows, 20), [2, 2])
for rank in (0, 1):
    report(f"the kit's setting, rank {rank} of 2: 56 rows, 4 shards, buffer 16, StatefulDataLoader batches of 2",
           functools.partial(rows, 56, shards=4, buffer=16, rank=rank, world=2), [4, 4], loader=True)
report("the kit's setting, rank 0 of 2, restarted once after 8 steps (16 rows)",
       functools.partial(rows, 56, shards=4, buffer=16, world=2), [8], loader=True)
report("the same with buffer_size=1, rank 0 of 2", functools.partial(rows, 56, shards=4, buffer=1, world=2),
       [4, 4], loader=True)
report("the same with Dataset.shuffle(seed) and no buffer, rank 0 of 2",
       functools.partial(rows, 56, shards=4, buffer=0, map_shuffle=True, world=2), [4, 4], loader=True)
