# Table 11 "ASEntmax PN-D": configs/pn_d.py with ASEntmax attention: entmax-1.5 with the
# adaptive, length-dependent query scale on the NoPE heads (deep-spin/asentmax's adapt-softplus-tanh).
from configs.pn_d import *  # noqa: F401,F403

out_dir = 'out/scratch_asentmax_pn_d'
attn_alpha = 1.5
attn_scale = 'adaptive'
