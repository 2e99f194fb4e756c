# Table 11 "ASEntmax PN-D": configs/pn_d.py with ASEntmax attention: entmax-1.5 with the
# adaptive, length-dependent query scale on the NoPE heads
# (deep-spin/asentmax's adapt-softplus-tanh).
from configs.pn_d import *  # noqa: F401,F403

out_dir = 'out/scratch_asentmax_pn_d'
attn_alpha = 1.5
attn_scale = 'adaptive'
# entmax materialises its probabilities (no fused kernel takes NAPE's bias): at 16 x 2048 they
# alone are 116 GB per GPU (float32 for entmax's backward, bf16 for p @ v). 4 sequences per
# micro-step (8 micro-steps on 8 GPUs) keep the step the same and fit 80 GB: ~40 GB (hardware.py)
batch_size = 4
