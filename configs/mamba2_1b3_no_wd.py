# Table 5, Mamba2-1.3B CPT: no-WD (neither weight decay nor dropout).
from configs.mamba2_1b3_cpt import *  # noqa: F401,F403

out_dir = 'out/mamba2_1b3_no_wd'
weight_decay = 0.0
dropout_type = 'none'
dropout = 0.0
