"""MosaicML streaming: 5 samples on 2 ranks (one process each) give 6 slots, one sample trained twice per epoch;
and StreamingDataLoader counts a batch as len(batch[0]), so a collate_fn returning a list of sample dicts
miscounts its position (the count is the number of keys of the first sample).

Run: .venv-bench/bin/python conformance/report/repros/mosaicml_repeats_samples_across_ranks.py
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from benchmarks.peers import import_streaming  # streaming with the torchvision stub

CHILD = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from benchmarks.peers import import_streaming
ds = import_streaming().StreamingDataset(local=sys.argv[1], batch_size=1, shuffle=False)
print(json.dumps([int(s["id"]) for s in ds]))
"""

streaming = import_streaming()
root = tempfile.mkdtemp()
mds = os.path.join(root, "mds")
with streaming.MDSWriter(out=mds, columns={"id": "int", "x": "int"}, compression=None, progress_bar=False) as w:
    for i in range(5):
        w.write({"id": i, "x": 0})
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
procs = [subprocess.Popen([sys.executable, "-c", CHILD, mds], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                              LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
         for r in range(2)]
print("5 samples on 2 ranks:", [json.loads(p.communicate(timeout=300)[0].splitlines()[-1]) for p in procs])

ds = streaming.StreamingDataset(local=mds, batch_size=3, shuffle=False)
loader = streaming.StreamingDataLoader(ds, batch_size=3, collate_fn=lambda rows: rows)
next(iter(loader))
print("after one batch of 3 sample dicts (2 keys each), StreamingDataLoader counts", loader.num_samples_yielded,
      "samples: a state saved now resumes at sample", loader.state_dict()["sample_in_epoch"])
