# CPU scale: copy after a delay (tasks.DelayCopy, docs/methods.md): 4 symbols, then 2-8 filler
# symbols, then the copy; every sequence is as long as the longest test delay needs, so at test
# only the distance is new (delays up to 16x the longest trained), never the length.
#   python train.py configs/delay_copy.py
# The model and its training are configs/offset.py's (task_offset has no use here).
from configs.offset import *  # noqa: F401,F403

task = 'delay_copy'
out_dir = 'out/delay_copy'
task_min_len = 2
task_max_len = 8
needle_value_len = 4  # the source's length (of 12 symbols: 6 for the filler, 6 for the sources)

tokens_per_batch = 32 * 138  # every sequence: 128 + 2 * 4 + 3 tokens, 138 inputs
max_tokens = 1000 * 32 * 138  # 1000 steps
# delays up to 16x the longest trained; the longest sets the length
eval_lengths = [8, 16, 32, 64, 128]
