# Table 11 "ASEntmax WD": configs/wd.py with ASEntmax attention: entmax-1.5 with the
# adaptive, length-dependent query scale on the NoPE heads (deep-spin/asentmax's adapt-softplus-tanh).
from configs.wd import *  # noqa: F401,F403

out_dir = 'out/scratch_asentmax_wd'
attn_alpha = 1.5
attn_scale = 'adaptive'
