"""torchdata StatefulDataLoader + DistributedSampler: a checkpoint of 2 ranks resumed on 3 silently skips samples.

Run: .venv-bench/bin/python conformance/report/repros/torchdata_distributed_sampler_world_size_change.py
"""

import json

from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

rows = list(range(12))


def loader(world: int, rank: int) -> StatefulDataLoader:
    sampler = DistributedSampler(rows, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
    return StatefulDataLoader(rows, batch_size=1, sampler=sampler, drop_last=True, collate_fn=lambda b: b)


before, states = [], []
for rank in range(2):  # 2 ranks x 2 steps, then every rank saves its state
    ld = loader(2, rank)
    it = iter(ld)
    before += next(it) + next(it)
    states.append(json.loads(json.dumps(ld.state_dict())))
after = []
for rank in range(3):  # restarted on 3 ranks, rank r loading the state of rank r % 2: no error
    ld = loader(3, rank)
    ld.load_state_dict(states[rank % 2])
    after += [x for batch in ld for x in batch]
trained = before + after
print(f"before {sorted(before)}, after {sorted(after)}: never trained {sorted(set(rows) - set(trained))}, "
      f"twice {sorted({x for x in trained if trained.count(x) > 1})}")
