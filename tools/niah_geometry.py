"""
Where the study's NIAH-1 prompts put their needle: for each length, the tokens (bytes) between the
needle's number and the prompt's end in each of the fixed prompts that tools/study.py scores
(niah_measures: niah_single_1_short, seed 42, 20 a length), how many lie within a window, and the
nearest. docs/study.md quotes it: why cpt_niah sits at 0 at 4x-16x, and cpt_niah_far's distances.

    python -m tools.niah_geometry                  # cpt_niah's prompts (256 to 4096 bytes)
    python -m tools.niah_geometry --gap=144        # cpt_niah_far's (ruler.far_prompt)
"""

import sys

import ruler
from configurator import configure
from tokens import Tokenizer

# -----------------------------------------------------------------------------
lengths = [256, 512, 1024, 2048, 4096]
samples = 20
window = 128  # the RoPE layers' window in cpt_niah
gap = 0  # > 0: the far prompts, every needle at least gap tokens from the end
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:]))

tokenizer, data, sizes = Tokenizer({'kind': 'byte'}), ruler.Data(say=lambda *a: None), {}
for L in lengths:
    far = []
    for i in range(samples):
        args = ('niah_single_1_short', tokenizer, L, f'niah/{L}/{i}', 42, data, sizes)
        text, (answer,) = ruler.far_prompt(*args, gap) if gap else ruler.prompt(*args)
        # from the number's first token: the farthest of its digits
        far.append(len(tokenizer.encode(text[text.rfind(answer):])))
    print(f"{L}: within {window}: {sum(d <= window for d in far)} of {samples}, under {window}: "
          f"{sum(d < window for d in far)}; nearest {min(far)}; all: {sorted(far)}")
