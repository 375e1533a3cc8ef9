"""fusedopt under FSDP2 on the CPU: run with
    torchrun --nproc-per-node 2 examples/torch_fsdp.py [CHECKPOINT_DIR]
Each rank shards the model (fully_shard: every param a DTensor cut on dim 0), steps its shard
with fusedopt's fused AdamW (the clipping norm spans the ranks), and saves the optimizer with
torch.distributed.checkpoint (DCP), which loads back at any world size.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

import fusedopt.torch as ft

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# docs:begin fsdp
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)  # its params become DTensors, cut on dim 0 over the ranks
fully_shard(model)
opt = ft.Optimizer(model.parameters(), rule="adamw", lr=1e-3, max_grad_norm=1.0)
x = torch.randn(32, 64).chunk(world)[rank]  # this rank's part of the batch
y = torch.randint(0, 10, (32,)).chunk(world)[rank]
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()  # FSDP2 reduce-scatters the grads: each rank holds its shard's
    opt.step()  # one fused launch over this rank's shards; the clip norm spans the ranks
state = get_optimizer_state_dict(model, opt)  # DTensor states, the params' placement
folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "fusedopt-dcp")
dcp.save({"optimizer": state}, checkpoint_id=folder)  # loads back at any world size
# docs:end fsdp
if rank == 0:
    print(f"rank 0 of {world}: loss {loss.item():.4f}, exp_avg of "
          f"{type(opt.state[model[0].weight]['exp_avg']).__name__}s, saved to "
          f"{os.path.abspath(folder)}")
dist.destroy_process_group()
