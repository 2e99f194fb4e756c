# "PL-D": pre-linear dropout p = 0.1 on the input of every projection (q, k, v, o, up, down),
# no weight decay.
from configs.scratch import *  # noqa: F401,F403

out_dir = 'out/scratch_pl_d'
weight_decay = 0.0
dropout_type = 'pre_linear'
dropout = 0.1
