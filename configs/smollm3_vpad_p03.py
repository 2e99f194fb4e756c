# Table 8: SmolLM3-3B CPT with sliding windows, VPAD at the pre-linear sites at p = 0.3.
from configs.smollm3_vpad import *  # noqa: F401,F403

out_dir = 'out/smollm3_vpad_p03'
dropout = 0.3
