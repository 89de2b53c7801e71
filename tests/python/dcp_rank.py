"""One rank of the DCP tests (`test_dcp.py`): joins a gloo group of
WORLD_SIZE ranks on CPU and saves or loads a state dict through
`sluice.dcp` against the server at argv[2].

    python dcp_rank.py save|load|async|killed URL CHECKPOINT_ID OUT

The state dict is made from a seed, so every world size knows the
original: `w` sharded by rows and `m` by columns over the ranks (DTensor),
`b` a replicated bfloat16 vector, `step` a plain object (DCP's BYTE_IO).
A load on any world size writes, from rank 0, what it got as full tensors
to OUT (torch.save), for the test to compare with the original.
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import sluice
from sluice.dcp import SluiceReader, SluiceWriter


def original(scale=1):
    g = torch.Generator().manual_seed(1234)
    return {
        "w": torch.randn(12 * scale, 6, generator=g),
        "m": torch.randn(5, 8 * scale, generator=g),
        "b": torch.randn(9, generator=g).to(torch.bfloat16),
        "step": 41,
    }


def sharded(full, mesh):
    return {
        "w": distribute_tensor(full["w"], mesh, [Shard(0)]),
        "m": distribute_tensor(full["m"], mesh, [Shard(1)]),
        "b": full["b"],
        "step": full["step"],
    }


def empty_like(full, mesh):
    zeros = {k: torch.zeros_like(v) if torch.is_tensor(v) else 0 for k, v in full.items()}
    return sharded(zeros, mesh)


def gathered(state):
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def main():
    mode, url, cid, out = sys.argv[1:5]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    ckpt = sluice.Checkpoint(sluice.Client(url), "dcp", chunk_size=1 << 20, workers=2)
    if mode == "save":
        dcp.save(sharded(original(), mesh), storage_writer=SluiceWriter(ckpt), checkpoint_id=cid)
    elif mode == "async":
        # The save's bytes leave while a training step runs.
        state = sharded(original(), mesh)
        t0 = time.monotonic()
        future = dcp.async_save(state, storage_writer=SluiceWriter(ckpt), checkpoint_id=cid)
        returned = time.monotonic() - t0
        x = torch.randn(256, 256)
        steps = 0
        while not future.done():
            x = torch.tanh(x @ x.T / 256)
            steps += 1
        future.result()
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                f.write(f"{steps} {returned:.3f}\n")
    elif mode == "killed":
        # A big save that the test kills -9 once its uploads have begun.
        big = sharded(original(scale=400_000), mesh)
        print("saving", flush=True)
        dcp.save(big, storage_writer=SluiceWriter(ckpt), checkpoint_id=cid)
        print("saved", flush=True)
    else:
        state = empty_like(original(), mesh)
        dcp.load(state, storage_reader=SluiceReader(ckpt), checkpoint_id=cid)
        full = gathered(state)
        if dist.get_rank() == 0:
            torch.save(full, out)
    dist.barrier()
    dist.destroy_process_group()
    ckpt.close()


if __name__ == "__main__":
    main()
