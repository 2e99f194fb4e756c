# Table 8: SmolLM3-3B CPT with sliding windows, PN-D, pre-norm dropout at p = 0.3.
from configs.smollm3_pn_d import *  # noqa: F401,F403

out_dir = 'out/smollm3_pn_d_p03'
dropout = 0.3
