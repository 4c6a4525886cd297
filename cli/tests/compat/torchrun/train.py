"""Checks what torchrun gave this worker, all-reduces across every node, and takes one DDP step (gloo, CPU)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    assert int(os.environ["RANK"]) == rank and int(os.environ["WORLD_SIZE"]) == world, dict(os.environ)

    total = torch.tensor([float(rank)])
    dist.all_reduce(total)

    # Different weights on every rank: DDP must start them all from rank 0's and keep them equal.
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    weight = model.module.weight.detach().clone()
    everyone = [torch.zeros_like(weight) for _ in range(world)]
    dist.all_gather(everyone, weight)
    same = all(torch.equal(w, everyone[0]) for w in everyone)

    node = os.environ.get("SLURMD_NODENAME", "?")
    line = f"rank {rank}/{world} local {local} node {node} sum {int(total.item())} ddp {'ok' if same else 'DIVERGED'}\n"
    # One write(2) per line: the workers on a node share torchrun's stdout, and print() may write the text and
    # its newline separately (unbuffered Python), interleaving two workers' lines.
    os.write(1, line.encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
