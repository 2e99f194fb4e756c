# SmolLM3-3B CPT with sliding windows: VPAD at the pre-linear sites (Table 8: p = 0.1
# here; 0.2, 0.3 in configs/smollm3_vpad_p02.py, _p03.py).
from configs.smollm3_cpt import *  # noqa: F401,F403

out_dir = 'out/smollm3_vpad'
dropout_type = 'vpad'
dropout = 0.1
