"""The repository's own style rule: no line over 100 characters in its code, tests included.
HELMET's prompt templates in tools/helmet.py are copied byte for byte and keep their lines."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = {'tools/helmet.py': ('RULER_TEMPLATES', 'JSON_KV_TEMPLATE')}  # file -> names kept verbatim


def kept_lines(path, names):
    """The line numbers of the module-level assignments to `names`."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {i for node in tree.body if isinstance(node, ast.Assign)
            and any(getattr(t, 'id', None) in names for t in node.targets)
            for i in range(node.lineno, node.end_lineno + 1)}


def test_no_line_over_100_characters():
    files = [os.path.relpath(f, ROOT) for pattern in ('*.py', 'configs/*.py', 'ops/*.py',
                                                      'tools/*.py', 'data/*.py', 'data/*/*.py',
                                                      'scripts/*', 'tests/*.py')
             for f in glob.glob(os.path.join(ROOT, pattern))]
    assert {'train.py', 'ops/attention.py', 'tools/study.py', 'scripts/slurm.sh',
            'tests/conftest.py'} <= set(files)
    long = []
    for f in sorted(files):
        kept = kept_lines(f, COPIED[f]) if f in COPIED else set()
        long += [f"{f}:{i}" for i, line in enumerate(open(os.path.join(ROOT, f)), 1)
                 if len(line.rstrip('\n')) > 100 and i not in kept]
    assert not long, f"lines over 100 characters: {long}"
