# SmolLM3-3B CPT with sliding windows: PN-D, pre-norm dropout (Table 8: p = 0.1 here; 0.2 and
# 0.3 in configs/smollm3_pn_d_p02.py, _p03.py).
from configs.smollm3_cpt import *  # noqa: F401,F403

out_dir = 'out/smollm3_pn_d'
dropout_type = 'pre_norm'
dropout = 0.1
