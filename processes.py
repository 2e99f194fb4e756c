"""
train.py's processes under torchrun: the process group (NCCL on GPUs, gloo on CPUs), and FSDP2
(parallel='fsdp'): the model sharded block by block over the processes; for a checkpoint its
whole state is gathered, and so is the optimizer's. Each process holds 1/world of the weights,
gradients and AdamW state; SmolLM3-3B's CPT needs it (docs/smollm3-cpt.md). DDP needs nothing
here: train.py wraps the model itself.
"""

import ctypes
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import hardware


def start(device):
    """-> (rank, world, device): this process's place under torchrun (its own GPU), or (0, 1, device).
    device 'auto': cuda, mps, else cpu."""
    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
    hardware.check_device(device)
    if 'RANK' not in os.environ:
        return 0, 1, device
    if sys.platform == 'linux':  # torchrun starts each worker in a session of its own: end with torchrun
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (torchrun killed -9 included)
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    if device.startswith('cuda'):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def wrap(model, device_type, bf16):
    """Shard each block, then the rest (embedding, final norm, head), over every process; in bf16
    the weights are gathered in bf16 and the gradients reduced in fp32."""
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def model_state(model):
    """The whole model's state dict on the CPU, as state_dict() of the unsharded model gives it:
    tied weights (wte, lm_head) come back gathered twice, and are kept once."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    first = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in state:
            state[name] = state[first.setdefault(id(p), name)]
    return state


def optimizer_state(model, optimizer):
    """The whole optimizer state, gathered on the CPU of the first process (an empty dict on the
    others), keyed by parameter name: train.py writes it with torch.save like any checkpoint and
    reads it back with weights_only=True. (torch.distributed.checkpoint's sharded format would
    read its metadata with pickle, which can run code.)"""
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer(model, optimizer, state):
    """Every process takes its shards of the whole state `state` (each reads the file, memory-mapped)."""
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def finish():
    """Every process done (the first was writing) before the group goes. gloo (CPU) can abort a
    process at interpreter exit ("terminate called without an active exception", about one run in
    eight): everything is written and synced, so leave at once."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
