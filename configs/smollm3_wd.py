# SmolLM3-3B CPT with sliding windows: SW, WD (weight decay 0.1, no dropout).
from configs.smollm3_cpt import *  # noqa: F401,F403

out_dir = 'out/smollm3_wd'
weight_decay = 0.1
