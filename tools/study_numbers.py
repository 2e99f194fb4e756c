"""
docs/study-numbers.md from the results in assets/, nothing trained: each section is the summary.md
that `python -m tools.study --report=<results.json>` writes, under its heading, so that the file
is made by the study's own reading rules and never edited by hand.

    python -m tools.study_numbers                  # rewrite docs/study-numbers.md
    python -m tools.study_numbers --check=True     # exit 1 if it differs from what the code makes
"""

import os
import subprocess
import sys
import tempfile

from configurator import configure

# -----------------------------------------------------------------------------
path = 'docs/study-numbers.md'
check = False  # compare with the file instead of writing it
# -----------------------------------------------------------------------------
globals().update(configure(globals(), sys.argv[1:]))

HEAD = """# The small-scale study: every number

Made by `python -m tools.study --report=<results.json> --out=<folder>` from the results in
`assets/` (nothing trained): each part's claims, paired seed by seed and read by the rule of
[study.md](study.md#how-a-verdict-is-drawn), against every baseline, then every table. The
figures are in `assets/study_*.png`. The whole file: `python -m tools.study_numbers`.
"""
# (heading, the arguments of the runs, the results file): in the order of docs/study.md
SECTIONS = [
    ('NoPE with 5 seeds: the headline comparisons (lm_nope)',
     """--parts="['lm_nope']" --variants="['wd','no_wd','pn_d','pl_d','vpad']" """
     """--seeds="[1,2,3,4,5]" --out=out/study_nope5""", 'study_nope5_results.json'),
    ('The default parts (lm_nope, lm_sw, lm_nape, needle_nope, needle_sw), seeds 1-3', '',
     'study_results.json'),
    ('Mamba2 (copy_mamba, lm_mamba, lm_mamba_32)',
     """--parts="['copy_mamba', 'lm_mamba', 'lm_mamba_32']" --out=out/study_mamba""",
     'study_mamba_results.json'),
    ('cpt_sw, cpt_sw_needle', """--parts="['cpt_sw', 'cpt_sw_needle']" --out=out/study_cpt""",
     'study_cpt_results.json'),
    ('Table 1 in small: NIAH-1 after CPT into windows (cpt_niah)',
     """--parts="['cpt_niah']" --out=out/study_niah""", 'study_niah_results.json'),
    ('Table 1 with a positive control: every needle beyond the window (cpt_niah_far)',
     """--parts="['cpt_niah_far']" --out=out/study_niah_far""", 'study_niah_far_results.json'),
    *[(f'The methods on {what} ({p}{", docs/methods.md" if p == "methods" else ""})',
       f"""--parts="['{p}']" --out=out/study_{p}""", f'study_{p}_results.json')
      for p, what in (('methods', 'language'),
                      ('methods_offset', 'the fixed-offset probe'),
                      ('methods_delay', 'the delay copy'),
                      ('methods_needle', 'the symbol needle'))],
]

text = [HEAD]
with tempfile.TemporaryDirectory() as tmp:
    for i, (heading, args, results) in enumerate(SECTIONS):
        out = os.path.join(tmp, str(i))
        r = subprocess.run([sys.executable, '-m', 'tools.study', f'--report=assets/{results}',
                            f'--out={out}'], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"--report=assets/{results} failed:\n{r.stderr[-2000:]}")
        runs = f'python -m tools.study {args}'.strip()
        text += [f'## {heading}\n', f'The runs: `{runs}`; this summary: `python -m tools.study '
                 f'--report=assets/{results} --out=out/report`.\n',
                 open(os.path.join(out, 'summary.md')).read()]
text = '\n'.join(text)
if check:
    same = os.path.exists(path) and open(path).read() == text
    print(f"{path} {'is' if same else 'is not'} what the code makes from assets/")
    sys.exit(0 if same else 1)
with open(path, 'w') as f:
    f.write(text)
print(f"wrote {path}")
