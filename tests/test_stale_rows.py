"""No table mixes in a stale or wrong row: a row's saved samples (ruler.Results) are read back only
under every setting that made their prompts and scores, and a table averages exactly the samples
its title names. Each setting, changed: the row is recomputed or refused, never reused."""

import json

import pytest

import ruler
from conftest import run_script
from test_eval import save_tiny

NIAH = ['--task=niah_single_1_short', '--lengths=[256]', '--depths=[]']
RULER = ["--tasks=['niah_single_2', 'fwe']", '--lengths=[1024]']


def rows(path):
    lines = path.read_text().splitlines()
    return json.loads(lines[0])['settings'], [json.loads(line) for line in lines[1:]]


def plant(path, scores):
    """Rewrite the saved scores by id (the settings line kept): a stale sample made visible."""
    head, *lines = path.read_text().splitlines()
    out = [head]
    for line in lines:
        row = json.loads(line)
        row['score'] = scores.get(row['id'], row['score'])
        out.append(json.dumps(row))
    path.write_text('\n'.join(out) + '\n')


@pytest.fixture
def ckpt(tiny_data, tmp_path):
    return save_tiny(tmp_path / 'ckpt_000007.pt', tiny_data)


def test_fewer_samples_average_those_samples_only(ckpt, tmp_path):
    """6 samples scored, then 4 asked: the score is the mean of samples 0-3, not of all 6 saved
    (it was 16.7 under a '4 samples' title, with one saved score of the 6 set to 1)."""
    assert run_script('eval_niah.py', f'--ckpt={ckpt}', *NIAH, '--samples=6') == (0, '')
    jsonl = tmp_path / 'ckpt_000007_niah.jsonl'
    plant(jsonl, {'niah/256/0': 0.0, 'niah/256/1': 0.0, 'niah/256/2': 0.0, 'niah/256/3': 1.0,
                  'niah/256/4': 1.0, 'niah/256/5': 1.0})
    assert run_script('eval_niah.py', f'--ckpt={ckpt}', *NIAH, '--samples=4') == (0, '')
    assert json.load(open(tmp_path / 'ckpt_000007_niah.json'))['niah_1'] == {'256': 25.0}
    assert len(rows(jsonl)[1]) == 6  # the others kept, for a later run that asks for them
    # RULER's tasks alike
    assert run_script('eval_ruler.py', f'--ckpt={ckpt}', *RULER, '--samples=3') == (0, '')
    jsonl = tmp_path / 'ckpt_000007_ruler.jsonl'
    plant(jsonl, {f'{t}/1024/{i}': 1.0 * (i == 2) for t in ('niah_single_2', 'fwe')
                  for i in range(3)})
    assert run_script('eval_ruler.py', f'--ckpt={ckpt}', *RULER, '--samples=2') == (0, '')
    summary = json.load(open(tmp_path / 'ckpt_000007_ruler.json'))
    assert summary['average'] == {'1024': 0.0}


def test_the_haystack_that_made_a_row_keys_it(ckpt, tmp_path, monkeypatch):
    """Rows scored on the Shakespeare stand-in are refused once RULER's essays exist (they were
    read back, the stand-in notice dropped); and rows on one essay file, once it changes."""
    essay = tmp_path / 'essays.json'
    monkeypatch.setattr(ruler, 'ESSAY', str(essay))  # the default --essay, not there yet
    args = [f'--ckpt={ckpt}', *RULER, '--samples=1']
    assert run_script('eval_ruler.py', *args) == (0, '')
    jsonl = tmp_path / 'ckpt_000007_ruler.jsonl'
    assert rows(jsonl)[0]['haystack'] == "stand-in: Shakespeare's plays"
    # and the table says so
    assert run_script('eval_ruler.py', f"--ckpt=['{ckpt}', '{ckpt}']", *args[1:],
                      f'--table={tmp_path}/t') == (0, '')
    assert 'the essay tasks on a stand-in haystack' in (tmp_path / 't.md').read_text()
    essay.write_text(json.dumps({'text': 'Some essay words that are not Shakespeare. ' * 400}))
    code, message = run_script('eval_ruler.py', *args)
    assert code == 1 and 'holds results of other settings (haystack: ' in message
    assert run_script('eval_ruler.py', *args, '--overwrite=True') == (0, '')
    assert rows(jsonl)[0]['haystack'].startswith(str(essay))
    essay.write_text(json.dumps({'text': 'Other essay words, another file. ' * 400}))
    code, message = run_script('eval_ruler.py', *args)
    assert code == 1 and 'haystack: ' in message
    # a task on no file has no haystack in its settings
    assert run_script('eval_niah.py', f'--ckpt={ckpt}', *NIAH, '--samples=1') == (0, '')
    assert 'haystack' not in rows(tmp_path / 'ckpt_000007_niah.jsonl')[0]


def test_the_template_that_made_a_row_keys_it(ckpt, tmp_path, monkeypatch):
    """A prompt's template (or answer prefix, needle, noise, task settings) changed in ruler.py:
    the rows made of the old one are refused."""
    args = [f'--ckpt={ckpt}', *NIAH, '--samples=1']
    assert run_script('eval_niah.py', *args) == (0, '')
    kind = ruler.KINDS['niah_short']
    monkeypatch.setitem(ruler.KINDS, 'niah_short',
                        kind._replace(template="Remember the number.\n{context}\n"))
    code, message = run_script('eval_niah.py', *args)
    assert code == 1 and 'holds results of other settings (prompts: ' in message


@pytest.mark.parametrize('change', ['window', 'task', 'tokenizer', 'seed', 'weights'])
def test_every_other_setting_that_makes_a_row_keys_it(ckpt, tmp_path, change):
    """The settings a row already carried: refused when changed (the tokenizer and weights as a
    checkpoint of another tokenizer or weights would have them: their recorded value changed)."""
    args = [f'--ckpt={ckpt}', '--task=niah_single_1_short', '--lengths=[256]', '--depths=[]',
            '--samples=1']
    assert run_script('eval_niah.py', *args) == (0, '')
    jsonl = tmp_path / 'ckpt_000007_niah.jsonl'
    if change in ('tokenizer', 'weights'):
        head, *lines = jsonl.read_text().splitlines()
        settings = json.loads(head)['settings']
        settings[change] = {'kind': 'gpt2'} if change == 'tokenizer' else 'another digest'
        jsonl.write_text('\n'.join([json.dumps({'settings': settings}), *lines]) + '\n')
    else:
        args = [a for a in args if not a.startswith('--task')] + {
            'window': ['--task=niah_single_1_short', '--window=8'],
            'task': ['--task=niah_single_1'], 'seed': ['--task=niah_single_1_short',
                                                       '--seed=7']}[change]
        if change == 'task':
            args = [a if a != '--lengths=[256]' else '--lengths=[512]' for a in args]
    code, message = run_script('eval_niah.py', *args)
    assert code == 1 and 'holds results of other settings (' in message
    assert f'{change}: ' in message


def test_new_lengths_are_scored_and_only_the_lengths_asked_are_averaged(ckpt, tmp_path):
    args = [f'--ckpt={ckpt}', '--task=niah_single_1_short', '--depths=[]', '--samples=1']
    assert run_script('eval_niah.py', *args, '--lengths=[256, 512]') == (0, '')
    plant(tmp_path / 'ckpt_000007_niah.jsonl', {'niah/512/0': 1.0})
    assert run_script('eval_niah.py', *args, '--lengths=[256, 384]') == (0, '')
    assert json.load(open(tmp_path / 'ckpt_000007_niah.json'))['niah_1'].keys() == {'256', '384'}
    assert {r['id'] for r in rows(tmp_path / 'ckpt_000007_niah.jsonl')[1]} == {
        'niah/256/0', 'niah/512/0', 'niah/384/0'}
