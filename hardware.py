"""
The machine a run uses: its device (check_device), the memory a training step holds per process
tensor by tensor (train.py prints it before training, so that a config that cannot fit says so
at once; tests/test_hardware.py checks it against the tensors a compiled CPU step saves for its
backward), the memory of a long prefill and decoding through the KV cache (tools/gpu_check.py
holds a GPU's peak to both), the GPU's peak FLOP/s for MFU, and train.py's processes under
torchrun: the process group (NCCL on GPUs, gloo on CPUs), each one's share of an evaluation, and
FSDP2 (parallel='fsdp': the model sharded block by block; for a checkpoint its whole state and
the optimizer's are gathered). Each FSDP process holds 1/world of the weights, gradients and AdamW
state; SmolLM3-3B's CPT needs it (docs/smollm3-cpt.md). DDP needs nothing here: train.py wraps
the model itself.
"""

import ctypes
import os
import signal
import sys

import torch
import torch.distributed as dist


def memory_estimate(model, batch_size, block_size, bf16, checkpointing=False, fsdp_world=1,
                    no_sync=False, averages=0, device_type='cuda'):
    """-> bytes by part: 'states' (float32 weights, gradients and AdamW's two moments, 16 bytes a
    parameter, and 4 per running average of train.py's average_last, sharded by FSDP; plus the
    unsharded float32 gradients FSDP keeps across no-sync micro-steps), 'activations' (what the
    blocks save for the backward, block_bytes() a token and layer; with activation checkpointing
    a float32 block input per layer plus one block; in bf16 without FSDP also the bf16 copies of
    the weights autocast keeps, 2 bytes a parameter), 'attention' (the T x T probabilities where
    they are materialised: entmax but on CUDA, the 'manual' backend, and on CPU SDPA's math kernel,
    which takes attention dropout; the fused kernels keep none) and 'logits' (the float32
    log-probabilities saved, 4 bytes per token and vocabulary entry, and the gradient of the
    logits the backward starts from, in float32 and the compute dtype)."""
    c, tokens, n = model.config, batch_size * block_size, model.num_params(False)
    e = 2 if bf16 else 4  # bytes of the compute dtype
    states = (16 + 4 * averages) * n / fsdp_world + (4 * n if no_sync else 0)
    block = tokens * block_bytes(model, e)
    # after the last block: the residual stream (float32) and its norm, the head's input; in bf16
    # autocast's copies of the weights (under FSDP they are gathered in bf16 and freed instead)
    head = tokens * (4 + e) * c.n_embd + (2 * n if bf16 and fsdp_world == 1 else 0)
    # probabilities: float32 ones saved by the normaliser's backward, and the compute-dtype copy
    # saved by p @ v (under attention dropout: the dropped copy, and the mask, a byte an entry)
    manual = getattr(c, 'attn_backend', '') == 'manual'
    dropped = getattr(c, 'attn_dropout', 0.0) > 0
    alpha = getattr(c, 'attn_alpha', 1.0)
    # entmax-1.5 on CUDA: attention_triton's kernel, which saves o2 (float32) and two float32
    # figures a row and head instead
    fused_entmax = alpha == 1.5 and not manual and device_type == 'cuda'
    if fused_entmax:
        block += tokens * 4 * (c.n_head * (c.head_dim or c.n_embd // c.n_head) + 2 * c.n_head)
    materialised = ((alpha != 1.0 and not fused_entmax) or manual
                    or (dropped and device_type == 'cpu'))
    per_entry = 4 + ((1 + e) if dropped else (2 if bf16 else 0))
    probs = per_entry * batch_size * c.n_head * block_size ** 2 if materialised else 0  # per layer
    if checkpointing:  # the block inputs, and one block recomputed at a time
        acts, attention = 4 * tokens * c.n_embd * c.n_layer + block + head, probs
    else:
        acts, attention = block * c.n_layer + head, probs * c.n_layer
    return {'states': states, 'activations': acts, 'attention': attention,
            'logits': (8 + e) * tokens * c.vocab_size}


def block_bytes(model, e):
    """Bytes a block saves for its backward, per token: tensor by tensor as Inductor's partitioner
    keeps them in a compiled step (tests/test_hardware.py counts them on CPU), with the fused
    attention kernels (flash, flex); e bytes an element of the compute dtype. Mamba2: the 34 bytes
    per token and unit of width of Korthikanti et al. (2022), in bf16 (not measured). The
    dropout's share: dropout_bytes."""
    c = model.config
    C = c.n_embd
    if not hasattr(c, 'n_head'):
        return 34 * C * e // 2 + dropout_bytes(model, e)
    hd = c.head_dim or C // c.n_head
    Cq, Ckv, F = c.n_head * hd, (c.n_kv_head or c.n_head) * hd, c.ffn_dim or 4 * C
    swiglu = c.mlp == 'swiglu'
    return (4 * C  # the block's input (the float32 residual stream) ...
            + e * (C + Cq + 2 * Ckv)  # ... its norm; q, k and v after RoPE
            + e * 2 * Cq + 4 * c.n_head  # attention's output, its copy into o_proj; log-sum-exp
            + e * 2 * C  # o_proj's output (the residual after attention is recomputed); its norm
            + e * (3 if swiglu else 2) * F  # gate, up and silu(gate) * up, or up and its GELU
            + dropout_bytes(model, e))


def dropout_bytes(model, e):
    """Bytes per token and layer that the dropout operators save for the backward, counted from
    the calls of a training forward of two tokens (on the meta device if the model is there; the
    random state and the model's mode put back), so that a new type of dropout.py is counted at
    the sites its model calls it from, without an edit here: each call's mask, a byte an element
    of its input, and, where another call dropped the same input before (PL-D's q, k and v of
    one normed x; gate and up), the dropped copy each further call's projection saves, e bytes an
    element. VPAD's means are recomputed in the backward."""
    calls, seen = [], {}

    def count(module, inp, out):
        x = inp[0]
        calls.append(x[0, 0].numel() * (1 + (e if id(x) in seen else 0)))
        seen[id(x)] = x  # (kept alive: an id is not reused while the forward runs)
    hooks = [m.register_forward_hook(count) for m in model.modules()
             if type(m).__module__ == 'dropout']
    training, device = model.training, next(model.parameters()).device
    try:
        with (torch.random.fork_rng(devices=[device] if device.type == 'cuda' else []),
              torch.no_grad()):
            model.train()(torch.zeros(1, 2, dtype=torch.long, device=device))
    finally:
        model.train(training)
        for h in hooks:
            h.remove()
    return sum(calls) // model.config.n_layer


def describe_memory(model, batch_size, block_size, bf16, checkpointing=False, fsdp_world=1,
                    no_sync=False, device=None, averages=0):
    """memory_estimate as train.py prints it, in GB by part and in all; given the device, a
    SystemExit if the total is more than it has (machine_memory)."""
    parts = memory_estimate(model, batch_size, block_size, bf16, checkpointing, fsdp_world, no_sync,
                            averages, torch.device(device).type if device else 'cuda')
    gb = {k: v / 2 ** 30 for k, v in parts.items()}
    line = (f"memory per process (estimate): weights, gradients and AdamW"
            f"{' and running averages' if averages else ''} {gb['states']:.1f} GB"
            f" + activations {gb['activations']:.1f} GB + attention probabilities "
            f"{gb['attention']:.1f} GB + logits {gb['logits']:.1f} GB = {sum(gb.values()):.1f} GB "
            f"(batch_size {batch_size} x {block_size}"
            f"{', activation checkpointing' if checkpointing else ''}"
            f"{f', FSDP over {fsdp_world}' if fsdp_world > 1 else ''})")
    have = machine_memory(device) if device else None
    if have and sum(parts.values()) > have:
        raise SystemExit(f"config error: the run does not fit: {line}, more than the "
                         f"{have / 2 ** 30:.1f} GB of {device}. Use a smaller model or batch_size, "
                         f"activation_checkpointing, or FSDP")
    return line


# A planned run's GPU-hours assume this fraction of the bf16 peak: nanoGPT-class dense training
# reaches 40-50% on A100/H100, a 3B model under FSDP with activation checkpointing less (the
# recomputed forward is not counted as useful work), so 0.35; unmeasured here (no GPU has run)
PLAN_MFU = 0.35


def plan(model, block_size, tokens, n_params, ckpt_steps, keep_last, averages, out_dir,
         free=None):
    """What a run will cost, said before it starts -> (line, SystemExit or None): its training
    FLOPs (model.flops_per_token x tokens); GPU-hours on an H100 and an H200 at PLAN_MFU; the bytes
    of a checkpoint (float32 weights, 4 a parameter) and of its optimizer state (AdamW's two
    moments, 8; plus 4 per running average: train.py's average_last), what the run writes and
    what it keeps (keep_last of the ckpt_steps checkpoints, two optimizer states, the averages),
    and the most it holds at once: at a save, whose pair is written before the older ones go
    (checkpoint.save_pair), or at the end, with the averages. That peak against the free space of
    out_dir's disk (or `free` bytes): the error, if it cannot fit (train.py raises it for a new
    run)."""
    import shutil
    flops = model.flops_per_token(block_size) * tokens
    hours = {g: flops / (PEAK_FLOPS[g] * PLAN_MFU) / 3600 for g in ('NVIDIA H100', 'NVIDIA H200')}
    ckpt, optim = 4 * n_params, (8 + 4 * averages) * n_params
    kept_ckpts = min(keep_last, ckpt_steps) if keep_last else ckpt_steps
    written, kept = ckpt_steps * (ckpt + optim), kept_ckpts * ckpt + min(2, ckpt_steps) * optim
    # a save: one checkpoint and one optimizer state more, until it removes the older ones
    peak = max(min(kept_ckpts + 1, ckpt_steps) * ckpt + min(3, ckpt_steps) * optim,
               kept + averages * ckpt)
    where = os.path.abspath(out_dir)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free if free is None else free
    gb = lambda b: f"{b / 2 ** 30:,.3g} GB"  # noqa: E731
    line = (f"plan: {flops:.3g} training FLOPs, {hours['NVIDIA H100']:,.3g} GPU-hours on H100 or "
            f"{hours['NVIDIA H200']:,.3g} on H200 at {PLAN_MFU:.0%} MFU (assumed); a checkpoint "
            f"{gb(ckpt)} and its optimizer state {gb(optim)}, {ckpt_steps} written "
            f"({gb(written)}), {kept_ckpts} kept with {min(2, ckpt_steps)} optimizer states "
            f"({gb(kept)})" + (f" and {averages} averages" if averages else '')
            + f"; at most {gb(peak)} on the disk at once; {gb(free)} free at {where}")
    error = None if peak <= free else SystemExit(
        f"config error: the run holds up to {gb(peak)} of checkpoints at once, more than the "
        f"{gb(free)} free at {where}: raise ckpt_interval, set keep_last (train.py's average_last "
        f"averages without keeping checkpoints), or free some space")
    return line, error


def check_device(device):
    """SystemExit, said plainly, for a device this machine does not have (no GPU, too high an
    index)."""
    kind, _, index = device.partition(':')
    if kind not in ('cpu', 'cuda', 'mps') or index and not index.isdigit():
        raise SystemExit(f"config error: device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', "
                         f"got {device!r}")
    if kind == 'cuda' and torch.cuda.device_count() <= int(index or 0):
        raise SystemExit(f"config error: device = {device!r}, but torch sees "
                         f"{torch.cuda.device_count()} GPU(s) here: use --device=cpu (or 'auto')")
    if kind == 'mps' and not torch.backends.mps.is_available():
        raise SystemExit("config error: device = 'mps', but this machine has no MPS: use "
                         "--device=cpu (or 'auto')")


def machine_memory(device):
    """Bytes of memory one process on device can have: the GPU's, or the machine's RAM."""
    if str(device).startswith('cuda'):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def inference_estimate(model, length, chunk, bf16):
    """-> bytes by part of a transformer's chunked prefill of `length` tokens, then greedy decoding
    (model.generate, timing.context_times), with fused attention (flex; SDPA's causal kernels):
    'weights' (in the compute dtype), 'cache' (every layer's keys and values: a full layer's buffer
    of `length` positions, model.KVCache; a windowed layer keeps its last W - 1 as a view of the
    chunk's concatenation, whose storage holds W - 1 + chunk), 'transient' (the most held at once
    besides: a windowed layer's next concatenation while the last one lives, and the chunk's
    activations)."""
    c, b = model.config, 2 if bf16 else 4
    hd = c.head_dim or c.n_embd // c.n_head
    per_token = 2 * (c.n_kv_head or c.n_head) * hd * b  # one layer's key and value
    held = [min(length, w - 1 + chunk) if w else length for w in c.layer_windows()]
    joined = [h for h, w in zip(held, c.layer_windows()) if w]  # (a full layer writes in place)
    ffn = c.ffn_dim or 4 * c.n_embd
    acts = chunk * (8 * c.n_embd + 3 * ffn) * b  # residual, normed input, q/k/v/o; MLP's gate, up
    return {'weights': b * model.num_params(False), 'cache': per_token * sum(held),
            'transient': per_token * max(joined, default=0) + acts}


# dense bf16 peak FLOP/s of a GPU (vendor data sheets, without sparsity), for MFU, by the exact name
# torch.cuda.get_device_name reports: an H100 PCIe (756 TF) or NVL (835 TF) must not pass for the
# SXM part (989 TF), nor an A10G for an A10. A GPU not named here gets no MFU.
PEAK_FLOPS = {'NVIDIA A100-SXM4-80GB': 312e12, 'NVIDIA A100-SXM4-40GB': 312e12,
              'NVIDIA A100 80GB PCIe': 312e12, 'NVIDIA A100-PCIE-40GB': 312e12,
              'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA H100': 989e12, 'NVIDIA H100 PCIe': 756e12,
              'NVIDIA H100 NVL': 835e12, 'NVIDIA H200': 989e12, 'NVIDIA H200 NVL': 835e12,
              'NVIDIA B200': 2250e12, 'NVIDIA L40S': 362e12, 'NVIDIA A10': 125e12,
              'NVIDIA L4': 121e12,
              'NVIDIA GeForce RTX 4090': 165e12}


def peak_flops(device, say=None):
    """(name, bf16 peak) of a CUDA device from PEAK_FLOPS; the peak is None on CPU or for a GPU
    not in the table. With say, a CUDA device's peak said, or why there is none."""
    if not str(device).startswith('cuda'):
        return str(device), None
    name = torch.cuda.get_device_name(torch.device(device))
    peak = PEAK_FLOPS.get(name)
    if say:
        say(f"MFU against {name}'s bf16 peak of {peak / 1e12:.0f} TFLOP/s" if peak else
            f"no MFU: {name!r} is not in hardware.PEAK_FLOPS (add its dense bf16 peak there)")
    return name, peak


# -----------------------------------------------------------------------------
# train.py's processes under torchrun (DDP needs nothing here; FSDP2 shards the model). FSDP's
# modules are imported where they are used: they import dynamo, 1.4 s at every start of a script


def start(device):
    """-> (rank, world, device): this process's place under torchrun (its own GPU), or (0, 1,
    device). device 'auto': cuda, mps, else cpu."""
    if device == 'auto':
        mps = torch.backends.mps.is_available()
        device = 'cuda' if torch.cuda.is_available() else 'mps' if mps else 'cpu'
    check_device(device)
    if 'RANK' not in os.environ:
        return 0, 1, device
    # torchrun starts each worker in a session of its own: end with torchrun
    if sys.platform == 'linux':
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (torchrun killed -9 included)
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    if device.startswith('cuda'):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def all_sum(t):
    """t summed in place over the processes that shared the work; t itself in one process."""
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


def share(n, rank, world):
    """The items 0..n-1 process rank of world takes, rank::world, padded to as many as the busiest
    process takes -> [(item, real)]: under FSDP every process runs each forward at once (its
    blocks gather their weights), so all run the same number; a pad repeats item 0, its result
    discarded."""
    return [(i if i < n else 0, i < n) for i in range(rank, -(-n // world) * world, world)]


def shard(model, device_type, bf16):
    """Shard each block, then the rest (embedding, final norm, head), over every process; in bf16
    the weights are gathered in bf16 and the gradients reduced in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def model_state(model):
    """The whole model's state dict on the CPU, as state_dict() of the unsharded model gives it:
    tied weights (wte, lm_head) come back gathered twice, and are kept once."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered on the CPU
    state = get_model_state_dict(model, options=whole)
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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered on the CPU
    return get_optimizer_state_dict(model, optimizer, options=whole)


def load_optimizer(model, optimizer, state, sharded):
    """A resumed run's optimizer state; sharded (FSDP), every process takes its shards of the whole
    state `state` (each reads the file, memory-mapped)."""
    if not sharded:
        return optimizer.load_state_dict(state)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, state,
                             options=StateDictOptions(full_state_dict=True))


def like(full, ref):
    """The whole tensor full laid out as ref: this process's shards where ref is a DTensor (FSDP),
    else full itself."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    return distribute_tensor(full, ref.device_mesh, ref.placements) if isinstance(ref, DTensor) \
        else full


def whole(t):
    """A tensor, gathered whole if it is a DTensor (every process calls this; torch.distributed's
    tensor module is not imported for it: 1 s at the first step of every run)."""
    return t.full_tensor() if hasattr(t, 'full_tensor') else t


def finish():
    """Every process done (the first was writing) before the group goes. gloo (CPU) can abort a
    process at interpreter exit ("terminate called without an active exception", about one run in
    eight): everything is written and synced, so leave at once."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
