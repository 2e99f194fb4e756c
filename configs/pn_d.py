# "PN-D": pre-norm dropout p = 0.1 (Eq. 6: on each sublayer output, before the residual add),
# no weight decay (the paper compares dropout against WD; that its dropout runs drop WD is our
# reading).
from configs.scratch import *  # noqa: F401,F403

out_dir = 'out/scratch_pn_d'
weight_decay = 0.0
dropout_type = 'pre_norm'
dropout = 0.1
