"""docs/tables.md: every command in its fenced blocks runs, on tiny checkpoints laid out as the
configs name them, and prints its table in the paper's layout (tools/tables.py)."""
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import shutil
import sys

import pytest

import checkpoint

from conftest import ROOT
from test_eval import save_tiny

PAGE = os.path.join(ROOT, 'docs', 'tables.md')
PAPER = ['1', '5', '6', '7', '8', '9', '10', '11', '12', '15', '17', 'figure1', 'figure3',
         'figure4', 'figure6']


def commands():
    """Every line of the page's fenced blocks, joined over its trailing backslashes."""
    text = open(PAGE).read()
    blocks = re.findall(r'^```[a-z]*\n(.*?)^```', text, re.S | re.M)
    return [line for b in blocks for line in b.replace('\\\n', ' ').splitlines() if line.strip()]


def save_quiet(path, data_dir, **changes):
    """A tiny checkpoint that answers the end of text at once (its final LayerNorm gives a
    constant that only the end-of-text row of its head reads): every answer is empty, so the
    tables cost a prefill per sample, not 128 decoding steps. RoPE: causal attention with no
    bias or mask to build (NAPE's bias costs more than the model at this size)."""
    save_tiny(path, data_dir, norm='layernorm', bias=True, tie_embeddings=False,
              pos_encoding='rope', **changes)
    ckpt = checkpoint.load(str(path))
    state = ckpt['model']
    state['norm_f.weight'].zero_()
    state['norm_f.bias'].fill_(1.0)
    state['lm_head.weight'].zero_()
    state['lm_head.weight'][256].fill_(1.0)  # the byte tokenizer's end of text
    checkpoint.save(ckpt, str(path))


@pytest.fixture(scope='module')
def layout(tiny_data, tmp_path_factory):
    """Two tiny checkpoints (steps 4 and 7) for every run a table names, with its config's dropout
    (Figure 3 probes the model's own operator), and the released models as checkpoint files; the
    lm-eval results of Table 7's rows in tools/eval_lm.py's layout."""
    from tools import tables
    root = tmp_path_factory.mktemp('tables')
    for spec in tables.TABLES.values():
        for _, name, which in spec['rows']:
            c = tables.config(name)
            if which in ('orig', 'sw'):
                path = root / 'weights' / os.path.basename(c['init_from'])
                paths = [path]
            else:
                folder = root / 'out' / os.path.basename(c['out_dir'])
                paths = [folder / 'ckpt_000004.pt', folder / 'ckpt_000007.pt']
            for path in paths:
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    save_quiet(path, tiny_data, dropout_type=c.get('dropout_type', 'none'),
                              dropout=c.get('dropout', 0.0))
    for i, (_, name, which) in enumerate(tables.TABLES['7']['rows']):
        c = tables.config(name)
        path = (root / 'weights' / os.path.basename(c['init_from']) if which == 'orig' else
                root / 'out' / os.path.basename(c['out_dir']) / 'ckpt_000007.pt')
        results = {t: {'acc,none': 0.5 + i / 100, **({'acc_norm,none': 0.25} if t == 'piqa' else
                                                      {})} for _, t in tables.BENCHMARKS}
        (path.parent / (path.name.removesuffix('.pt') + '_lm_eval.json')).write_text(
            json.dumps({'ckpt': str(path), 'results': results}))
    return root


def run_tables(args):
    """python -m tools.tables *args in this process -> what it printed."""
    argv, out = sys.argv, io.StringIO()
    sys.argv = ['tools/tables.py', *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, 'tools', 'tables.py'), run_name='__main__')
    except SystemExit as e:  # a refusal is the caller's to see
        if e.code not in (0, None):
            raise
    finally:
        sys.argv = argv
    return out.getvalue()


def test_every_command_of_the_page_prints_its_table(layout, tiny_data):
    from tools import tables
    lines = commands()
    # no command the page shows goes untested: each is a tools.tables line, one per table
    assert all(line.startswith('python -m tools.tables --table=') for line in lines), lines
    names = [re.search(r'--table=(\w+)', line).group(1) for line in lines]
    assert sorted(names) == sorted(PAPER)
    small = [f'--runs={layout}/out', f'--weights={layout}/weights', f'--out={layout}/tables',
             '--lengths=[1024]', '--samples=1', "--tasks=['niah_single_1']", '--window=8',
             '--niah_task=niah_single_1_short', '--ks=[2]', '--points=2',
             f'--data_dir={tiny_data}', '--max_length=96', '--smooth=8', '--docs=2']
    page = open(PAGE).read()
    for line, table in zip(lines, names):
        # the plans once (they cost a dry run per config); the page's figures from them below
        plans = '--plans=True' if table == '12' else '--plans=False'
        printed = run_tables(shlex.split(line)[3:] + small + [plans])
        check_layout(table, printed, layout)
        # the GPU-hours the page gives are the sum of the rows' plans
        hours = sum(tables.gpu_hours(name) for name in tables.trained(tables.TABLES[table]['rows']))
        section = page[page.index(f'<a id="{table}">'):]
        assert f"**{hours:,.0f} GPU-hours**" in section[:section.index('```')], (table, hours)
        if table == '12':
            assert f"training: {hours:,.0f} GPU-hours on H100" in printed


def check_layout(table, printed, layout):
    from tools import tables
    spec = tables.TABLES[table]
    if table == '6':
        lines = printed.splitlines()
        row = lines[lines.index(next(x for x in lines if x.startswith('SmolLM3, SW')))]
        assert row.split()[-14:] == ['0.1', '36', '2048', '11008', '16', '4096', 'dclm_edu', '1B',
                                     '1024K', '2e-05', 'SWU', '10.0%', '-', '2e-05'], row
        return
    labels = [label for label, _, _ in tables.expand(spec['rows'], [2])]
    if table == '9':  # --ks=[2]: the paper's K = 10 rows, the others gone
        assert labels == ['Orig.', 'SW, K=2', 'SW, attention dropout', 'SW, attention dropout, K=2']
    if table == '7':  # the mean of the 8 tasks, acc_norm where a task has it
        assert re.search(r'\nOriginal +50\.0 +50\.0 +50\.0 +25\.0( +50\.0){4} +46\.9\n', printed)
        assert '\n  paper             77.8' in printed
        return
    if table == 'figure3':
        assert re.search(r'\nPL-D +\d\.\d{3} +\d\.\d{3} +0\.29 / 0\.37\n', printed), printed
        assert os.path.exists(layout / 'out' / 'smollm3_vpad' / 'ckpt_000007_probe_vpad.json')
        return
    for label in labels:
        assert re.search(rf'\n{re.escape(label)} ', printed), (table, label)
    if table == 'figure1':  # each run at its checkpoints, named by their steps
        assert re.search(r'\nWD 4 .*\nWD 7 .*\nVPAD 4 .*\nVPAD 7 .*\|', printed), printed
    if table == 'figure6':  # each run at its last checkpoint (K = 0) and its average
        for run in ('WD', 'no-WD', 'PN-D', 'PL-D', 'VPAD'):
            assert re.search(rf'\n{run} +0 +0\.0 +- +32\.0000\n{run} +2 ', printed), run
    if table == 'figure4':  # the loss bands, then NIAH-1 and RULER by length
        assert re.search(r'\nrow +<=1x +1-2x +2-3x \| NIAH-1 +1K \| RULER +1K\n', printed)
    assert os.path.exists(layout / 'tables' / f"{table}.png" if table.startswith('figure') else
                          layout / 'tables' / f"table{table}_{spec['measures'][0][0]}.json")
    if not table.startswith('figure'):
        # each row: the run's newest checkpoint or its average, the released weights, SW windowed
        for m, _ in spec['measures']:
            found = json.load(open(layout / 'tables' / f"table{table}_{m}.json"))['rows']
            assert [r['label'] for r in found] == labels
            for r in found:
                name = os.path.basename(r['ckpt'])
                assert (name in ('ckpt_000007.pt', 'avg2_000004-000007.pt')
                        or r['ckpt'].startswith(str(layout / 'weights'))), r
                assert r['window'] == (8 if r['label'] in ('SW', 'SmolLM3-SW') else None), r
        # a row and the paper's line under it, in every measure's columns
        lines = printed.splitlines()
        last = max(i for i, x in enumerate(lines) if x.startswith(labels[-1] + ' '))
        assert lines[last + 1].startswith('  paper')
        assert lines[last].count('|') == lines[last + 1].count('|') == len(spec['measures']) - 1
        assert lines[last].split()[-1] == '0.0'  # an empty answer finds no needle


def test_a_missing_run_or_weights_is_said_before_anything_runs(layout, tmp_path):
    empty = tmp_path / 'nothing'
    with pytest.raises(SystemExit, match='holds no checkpoint: train it, torchrun'):
        run_tables(['--table=11', f'--runs={empty}', f'--out={tmp_path}/t'])
    with pytest.raises(SystemExit, match='put the released weights'):
        run_tables(['--table=12', f'--weights={empty}', f'--out={tmp_path}/t'])
    with pytest.raises(SystemExit, match='give --table= one of 1, 5, 6'):
        run_tables(['--table=2'])
    # an average of more checkpoints than a run has: said before any other average is written
    for run in ('smollm3_no_wd', 'smollm3_attn_dropout'):
        (tmp_path / 'runs' / run).mkdir(parents=True)
        for name in ('ckpt_000004.pt', 'ckpt_000007.pt'):
            shutil.copy(layout / 'out' / run / name, tmp_path / 'runs' / run / name)
    with pytest.raises(SystemExit, match=r'no average of 5 in .*smollm3_no_wd, and .* has 2 '
                                         r'checkpoints .* fewer than the 5 asked for'):
        run_tables(['--table=9', f'--runs={tmp_path}/runs', f'--weights={layout}/weights',
                    f'--out={tmp_path}/t', '--ks=[2, 5]'])
    assert not list((tmp_path / 'runs').glob('*/avg*')) and not os.path.exists(tmp_path / 't')
    # a file of someone else's where the table goes
    (tmp_path / 'mine').mkdir()
    (tmp_path / 'mine' / 'table11_ruler.md').write_text('my notes')
    with pytest.raises(SystemExit, match='table11_ruler.md'):
        run_tables(['--table=11', f'--runs={layout}/out', f'--out={tmp_path}/mine'])
    assert os.listdir(tmp_path / 'mine') == ['table11_ruler.md']


def test_the_papers_numbers_stand_under_their_own_lengths(capsys):
    """Each of the paper's numbers under the column of its length, '-' at a length it did not
    score and under a row it gives no numbers for."""
    from tools import tables
    spec = tables.TABLES['5']
    labels = [label for label, _, _ in spec['rows']] + ['ours']
    rows = [{'score': {L: 1.0 for L in (2048, 4096, 65536)}} for _ in labels]
    tables.print_layout(spec['title'], labels, [('niah', [2048, 65536], rows),
                                                ('ruler', [4096], rows)],
                        spec['paper'], dict(spec['measures']))
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ['NIAH-1', '|', 'RULER'] and lines[3].split() == [
        'model', '2K', '64K', '|', '4K']
    row = next(i for i, x in enumerate(lines) if x.startswith('PN-D, p=0.2 '))
    assert lines[row].split()[-4:] == ['1.0', '1.0', '|', '1.0']
    assert lines[row + 1].split() == ['paper', '100.0', '-', '|', '22.5']
    assert lines[-1].split() == ['paper', '-', '-', '|', '-']


def test_the_papers_numbers_on_the_page_are_those_the_commands_print():
    """Every '| Table n, the paper's |' block of the page holds, row by row, the numbers that
    tools/tables.py prints under that table's rows (and each table with numbers has its block)."""
    from tools import tables
    page = open(PAGE).read()
    blocks = dict(re.findall(r"^\| (?:Table|Figure) (\w+), the paper's \|.*\n\|[-|]+\n"
                             r"((?:\|.*\n)+)", page, re.M))
    for name, spec in tables.TABLES.items():
        if 'paper' not in spec:
            continue
        key = name.removeprefix('figure')
        assert key in blocks or name == '17', name  # 17: the numbers of 15, said so
        rows = {line.split(' | ')[0][2:]: line.strip(' |\n').split(' | ')[1:]
                for line in blocks.get(key, blocks['15']).splitlines()}
        assert list(rows) == list(spec['paper']), name
        for label, theirs in spec['paper'].items():
            if isinstance(theirs, dict):  # by measure, in the measures' order
                theirs = [v for m, _ in spec['measures'] for v in theirs.get(m, [])]
            elif isinstance(theirs, str):
                theirs = theirs.split()
            assert rows[label] == [str(v) for v in theirs], (name, label)
