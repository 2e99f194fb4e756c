# Table 11 "ASEntmax VPAD": configs/vpad.py with ASEntmax attention: entmax-1.5 with the
# adaptive, length-dependent query scale on the NoPE heads (deep-spin/asentmax's adapt-softplus-tanh).
from configs.vpad import *  # noqa: F401,F403

out_dir = 'out/scratch_asentmax_vpad'
attn_alpha = 1.5
attn_scale = 'adaptive'
