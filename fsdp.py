"""
FSDP2 for train.py (parallel='fsdp', under torchrun): the model sharded block by block over the
processes, its whole state gathered for a checkpoint, the optimizer state written and read in
shards. Each process holds 1/world of the weights, gradients and AdamW state; SmolLM3-3B's CPT
needs it (docs/smollm3-cpt.md).
"""

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import checkpoint


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


def save_optimizer(model, optimizer, path):
    """Every process writes its shards into the folder `path`; -> the folder's digest on the first
    process (None on the others). DCP reads its files with pickle: a resume checks them against
    this digest, kept in the weights_only checkpoint, before it reads them."""
    dcp.save({'optimizer': get_optimizer_state_dict(model, optimizer)}, checkpoint_id=path)
    dist.barrier()
    return checkpoint.folder_digest(path) if dist.get_rank() == 0 else None


def load_optimizer(model, optimizer, path):
    """Each process reads its own shards from the folder `path` (its digest checked beforehand)."""
    state = {'optimizer': get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(model, optimizer, state['optimizer'])
