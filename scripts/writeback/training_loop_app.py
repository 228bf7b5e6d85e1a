"""A CPU training loop, as bench_training_loop.py runs it: ``python3 training_loop_app.py THREADS STEPS EVERY OUT``.

An MLP (256 -> 512 -> 512 -> 2) trained with SGD on batches of 64 from a DataLoader with 2 worker
processes (each sample made from its index: no files read), torch's intra-op threads set to
THREADS (OpenMP: libgomp's team), and every EVERY steps a checkpoint saved as most loops save one:
``torch.save`` to ``OUT/ck-STEP.pt.tmp``, then ``os.replace`` to its name. Prints one JSON line:
the loop's seconds (from its first batch to its last step) and the saves' seconds. Imports nothing
of Monarch's."""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        x = torch.randn(256, generator=torch.Generator().manual_seed(i))
        return x, (x.sum() > 0).long()


def main(threads: int, steps: int, every: int, out: str) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Samples(), batch_size=64, num_workers=2))
    x, y = next(batches)  # the workers started: the loop's time is the steps'
    t0, saving = time.perf_counter(), 0.0
    for step in range(1, steps + 1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            s0 = time.perf_counter()
            tmp = os.path.join(out, f"ck-{step}.pt.tmp")
            torch.save(model.state_dict(), tmp)
            os.replace(tmp, tmp[:-len(".tmp")])
            saving += time.perf_counter() - s0
        x, y = next(batches)
    print(json.dumps({"loop_s": time.perf_counter() - t0, "save_s": saving}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
