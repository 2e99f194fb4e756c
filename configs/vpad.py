# "VPAD": variance-preserving affine dropout p = 0.1 at the pre-linear sites, no weight decay.
# VPAD's formula is our reconstruction (dropout.py; README "VPAD"), variant A by default.
from configs.scratch import *  # noqa: F401,F403

out_dir = 'out/scratch_vpad'
weight_decay = 0.0
dropout_type = 'vpad'
vpad_variant = 'A'
dropout = 0.1
