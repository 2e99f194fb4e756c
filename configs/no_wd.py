# "no-WD": the from-scratch NAPE transformer with neither weight decay nor dropout.
from configs.scratch import *  # noqa: F401,F403

out_dir = 'out/scratch_no_wd'
weight_decay = 0.0
