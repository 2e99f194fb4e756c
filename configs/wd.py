# Table 11 "WD": the from-scratch NAPE transformer with weight decay 0.1 and no dropout.
from configs.scratch import *  # noqa: F401,F403

out_dir = 'out/scratch_wd'
weight_decay = 0.1
