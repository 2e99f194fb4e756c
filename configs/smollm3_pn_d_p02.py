# Table 8: SmolLM3-3B CPT with sliding windows, PN-D, pre-norm dropout at p = 0.2.
from configs.smollm3_pn_d import *  # noqa: F401,F403

out_dir = 'out/smollm3_pn_d_p02'
dropout = 0.2
