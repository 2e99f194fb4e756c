# The CPU quick start with ASEntmax attention (entmax-1.5, the adaptive query scale on the NoPE
# heads): python train.py configs/quickstart_asentmax.py
from configs.quickstart import *  # noqa: F401,F403

out_dir = 'out/quickstart_asentmax'
attn_alpha = 1.5
attn_scale = 'adaptive'
