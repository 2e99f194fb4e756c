# SmolLM3-3B CPT with sliding windows: SW, no-WD (neither weight decay nor dropout).
from configs.smollm3_cpt import *  # noqa: F401,F403

out_dir = 'out/smollm3_no_wd'
weight_decay = 0.0
