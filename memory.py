"""
What a training step holds in memory per process, by a rule of thumb: train.py prints it before
training, so that a config that cannot fit says so at once. tests/test_memory.py checks the
activation terms against the tensors a CPU step saves for its backward.
"""


def estimate(model, batch_size, block_size, bf16, checkpointing=False, fsdp_world=1, no_sync=False):
    """-> bytes by part: 'states' (float32 weights, gradients and AdamW's two moments, 16 bytes a
    parameter, sharded by FSDP; plus the unsharded float32 gradients FSDP keeps across no-sync
    micro-steps), 'activations' (Korthikanti et al. 2022: about 34 bytes per token and unit of
    width in a layer, in bf16; with activation checkpointing a block input per layer plus one
    block), 'attention' (the attention probabilities where they are materialised: entmax, or the
    'manual' backend; the fused softmax kernels keep none) and 'logits' (bf16, their float32 copy
    and its gradient: 10 bytes per token and vocabulary entry)."""
    c, tokens, n = model.config, batch_size * block_size, model.num_params(False)
    states = 16 * n / fsdp_world + (4 * n if no_sync else 0)
    layer = 34 * tokens * c.n_embd * (1 if bf16 else 2)
    # probabilities: float32 ones saved by the normaliser's backward, and the compute-dtype copy
    # saved by p @ v (under attention dropout: the dropped copy, and the mask, a byte an entry)
    materialised = getattr(c, 'attn_alpha', 1.0) != 1.0 or getattr(c, 'attn_backend', '') == 'manual'
    per_entry = 4 + ((1 + (2 if bf16 else 4)) if getattr(c, 'attn_dropout', 0.0) > 0 else (2 if bf16 else 0))
    probs = per_entry * batch_size * c.n_head * block_size ** 2 if materialised else 0  # per layer
    if checkpointing:  # the block inputs, and one block recomputed at a time
        acts, attention = 2 * tokens * c.n_embd * c.n_layer + layer, probs
    else:
        acts, attention = layer * c.n_layer, probs * c.n_layer
    return {'states': states, 'activations': acts, 'attention': attention, 'logits': 10 * tokens * c.vocab_size}
