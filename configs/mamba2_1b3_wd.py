# Table 5, Mamba2-1.3B CPT: WD (weight decay 0.1, no dropout).
from configs.mamba2_1b3_cpt import *  # noqa: F401,F403

out_dir = 'out/mamba2_1b3_wd'
weight_decay = 0.1
dropout_type = 'none'
dropout = 0.0
