"""
The small-scale study's one rule for reading a comparison (docs/study.md, "How a verdict is drawn").

Two variants of one seed share everything but the variant: the initial weights, the batches in
the same order, and in the CPT parts the same phase 1. So they are compared seed by seed:

    d_s = a_s - b_s  (signed so that d_s > 0 means b is better, whatever the measure)

and the verdict comes from the mean of d over the n seeds and its 95% t-interval (n - 1 degrees of
freedom, Student's t):
    holds          the interval lies above 0
    reversed       the interval lies below 0
    does not hold  the interval contains 0: the difference is within the seeds' spread
Whether every seed points the same way is said apart: with 3 seeds the interval needs
|mean| > 2.48 std(d) (t = 4.30), so 3 seeds that agree are a sign to follow up, not a verdict.
"""

from math import sqrt
from statistics import mean, stdev

# the 97.5% quantile of Student's t by degrees of freedom (any table; tests/test_study.py checks
# scipy's)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def paired(a, b, lower_is_better):
    """a, b: one value per seed, the same seeds in the same order -> {'diffs': d_s, 'mean',
    'lo', 'hi' (the 95% t-interval), 'verdict', 'every_seed' (True if every d_s has one sign)}.
    One seed: no verdict, only its difference."""
    if len(a) != len(b) or not a:
        raise ValueError(f"a paired verdict needs the same seeds on both sides, got {len(a)} and "
                         f"{len(b)}: rerun the study with the same --seeds for both variants")
    if len(a) - 1 > max(T975):
        raise ValueError(f"{len(a)} seeds: T975 has t for 2 to {max(T975) + 1}; add its quantile")
    d = [(x - y) * (1 if lower_is_better else -1) for x, y in zip(a, b)]
    half = T975[len(d) - 1] * stdev(d) / sqrt(len(d)) if len(d) > 1 else float('inf')
    lo, hi = mean(d) - half, mean(d) + half
    verdict = ('no verdict (one seed)' if len(d) == 1 else
               'holds' if lo > 0 else 'reversed' if hi < 0 else 'does not hold')
    return {'diffs': d, 'mean': mean(d), 'lo': lo, 'hi': hi, 'verdict': verdict,
            'every_seed': len(d) > 1 and (all(x > 0 for x in d) or all(x < 0 for x in d))}
