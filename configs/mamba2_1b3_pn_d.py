# Table 5, Mamba2-1.3B CPT: PN-D p = 0.2 (pre-norm dropout on the mixer output), no weight decay.
from configs.mamba2_1b3_cpt import *  # noqa: F401,F403

out_dir = 'out/mamba2_1b3_pn_d'
weight_decay = 0.0
dropout_type = 'pre_norm'
dropout = 0.2
