"""HF datasets: uneven steps per rank after split_dataset_by_node, and a state re-saved before a step restarts the epoch.

Run: .venv-bench/bin/python conformance/report/repros/hf_datasets_uneven_steps_and_resave.py
"""

import json

from datasets import Dataset
from datasets.distributed import split_dataset_by_node


def dataset(rank: int = 0, world: int = 1, shuffle: bool = True):
    ds = Dataset.from_dict({"id": list(range(10))}).to_iterable_dataset(num_shards=4)
    if shuffle:
        ds = ds.shuffle(seed=0, buffer_size=4)
    return split_dataset_by_node(ds, rank=rank, world_size=world)


print("rows per rank (10 rows, 4 shards, 3 ranks):", [len(list(dataset(r, 3, False))) for r in range(3)],
      "-> the rank with more batches waits in its collective forever")

whole = [r["id"] for r in dataset()]
ds = dataset()
it = iter(ds)
head = [next(it)["id"] for _ in range(2)]
state = json.loads(json.dumps(ds.state_dict()))
resumed = dataset()
resumed.load_state_dict(state)
resaved = json.loads(json.dumps(resumed.state_dict()))  # e.g. a checkpoint written before the first step after resume
again = dataset()
again.load_state_dict(resaved)
print(f"uninterrupted {whole}\n2 rows, resume, save before a step, resume: {head} + {[r['id'] for r in again]}"
      f"\nstate re-saved right after load_state_dict equals the loaded one: {resaved == state}")
