# Table 11 "ASEntmax WD": configs/wd.py with ASEntmax attention: entmax-1.5 with the
# adaptive, length-dependent query scale on the NoPE heads
# (deep-spin/asentmax's adapt-softplus-tanh).
from configs.wd import *  # noqa: F401,F403

out_dir = 'out/scratch_asentmax_wd'
attn_alpha = 1.5
attn_scale = 'adaptive'
# written out, entmax's probabilities at 16 x 2048 alone are 116 GB per GPU (float32 for entmax's
# backward, bf16 for p @ v); attention_triton's fused kernel (CUDA) keeps none, but no GPU has
# measured it yet. 4 sequences per micro-step (8 micro-steps on 8 GPUs) keep the step the same and
# fit 80 GB either way (hardware.py)
batch_size = 4
