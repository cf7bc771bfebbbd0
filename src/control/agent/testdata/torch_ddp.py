"""A PyTorch DDP job as a queued resource's startup script runs it: one
process per host, torch.distributed set up from the worker's environment
alone (env:// init: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), Gloo.

Writes OUT_DIR/result.RANK.json: what DDP and an all_reduce computed, and
the framework variables this worker saw. Used by torch_ddp_test.cc.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
       "LOCAL_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
       "JAX_PROCESS_ID", "MEGASCALE_SLICE_ID", "TPU_WORKER_ID")


def main():
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")  # env://
    rank, world = dist.get_rank(), dist.get_world_size()

    # Each rank starts from its own weights; DDP broadcasts rank 0's (1.0).
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(float(rank + 1))
    ddp = DistributedDataParallel(model)
    # d(sum(w . x))/dw = x = rank + 1; DDP averages it over the ranks.
    x = torch.full((1, 2), float(rank + 1))
    ddp(x).sum().backward()

    ranks = torch.tensor([float(rank)])
    dist.all_reduce(ranks)  # the sum of the ranks
    result = {
        "rank": rank,
        "world_size": world,
        "weight": model.weight.detach().flatten().tolist(),
        "grad": model.weight.grad.flatten().tolist(),
        "rank_sum": ranks.item(),
        "env": {name: os.environ.get(name) for name in ENV},
    }
    dist.barrier()
    dist.destroy_process_group()
    path = os.path.join(out_dir, "result.%d.json" % rank)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.rename(path + ".tmp", path)


if __name__ == "__main__":
    main()
