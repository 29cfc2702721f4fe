"""Record one training step of a small model, simulate three prefetch policies from Python
(no file written or read), and print the fastest that fits under a memory cap.

    python python/examples/pick_policy.py      # needs torch and `pip install .`
"""

import torch

import fsdplab
from fsdplab.torch import Recorder

layer = torch.nn.TransformerEncoderLayer(64, nhead=4, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
opt = torch.optim.AdamW(model.parameters())
batches = [torch.randn(8, 16, 64) for _ in range(2)]


def train_step():
    for batch in batches:
        model(batch).square().mean().backward()
    opt.step()
    opt.zero_grad()


train_step()  # warm-up (AdamW's state), not recorded
rec = Recorder(model, optimizer=opt)
with rec.step():
    train_step()
trace = rec.trace()  # a dict: simulate() takes it as it is

cap = 64 << 20  # bytes per rank
cluster = {"world_size": 8}
runs = {}
for prefetch in (0, 1, 2):
    report = fsdplab.simulate(trace, policy={"forward_prefetch": prefetch}, cluster=cluster)
    s = report["summary"]
    runs[prefetch] = s
    print(f"forward_prefetch={prefetch}: step {s['step_time_us']:.1f} us, "
          f"peak reserved {s['peak_reserved_bytes'] / 2**20:.2f} MiB")
fits = [p for p, s in runs.items() if s["peak_reserved_bytes"] <= cap]
if fits:
    best = min(fits, key=lambda p: runs[p]["step_time_us"])
    print(f"best under {cap / 2**20:.0f} MiB: forward_prefetch={best}")
else:
    print(f"best under {cap / 2**20:.0f} MiB: none fits")
