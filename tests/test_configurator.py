"""The strict configurator: files, overrides, types, unknown keys."""

import importlib.util
import re
from typing import Literal

import pytest

from configurator import configure

DEFAULTS = {'learning_rate': 6e-4, 'n_layer': 12, 'compile': None, 'name': 'x',
            'eval_lengths': [1, 2], 'window': 0, 'flag': True,
            'PROJECTIONS': ('q_proj',),  # a module constant: not a key
            'schedule': 'wsd', '__annotations__': {'window': int | list, 'compile': bool | None,
                                                   'schedule': Literal['wsd', 'cosine']}}


def test_files_then_overrides(tmp_path):
    f = tmp_path / 'c.py'
    f.write_text("import math\nlearning_rate = 1e-3\nn_layer = 2 * 3\nwindow = [4, 0]\n"
                 "_private = 1\n")
    c = configure(dict(DEFAULTS), [str(f), '--n_layer=8', '--learning_rate=1', '--name=hello',
                                   '--eval_lengths=(3, 4)', '--compile=False'])
    assert c == {'learning_rate': 1, 'n_layer': 8, 'compile': False, 'name': 'hello',
                 'eval_lengths': [3, 4], 'window': [4, 0], 'flag': True, 'schedule': 'wsd'}
    assert configure(dict(DEFAULTS), ['--schedule=cosine'])['schedule'] == 'cosine'


def test_given_names_the_keys_a_run_sets(tmp_path):
    """Also a key set to its default value (n_layer = 12 here) counts as set; a key left alone
    does not."""
    f = tmp_path / 'c.py'
    f.write_text("n_layer = 12\n")
    given = set()
    configure(dict(DEFAULTS), [str(f), '--name=x'], given=given)
    assert given == {'n_layer', 'name'}


def test_a_file_can_import_another(tmp_path, monkeypatch):
    (tmp_path / 'base.py').write_text("n_layer = 24\nlearning_rate = 1e-4\n")
    (tmp_path / 'variant.py').write_text("from base import *\nlearning_rate = 2e-4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    c = configure(dict(DEFAULTS), [str(tmp_path / 'variant.py')])
    assert (c['n_layer'], c['learning_rate']) == (24, 2e-4)


@pytest.mark.parametrize('argv,message', [
    (['--learning_rat=1e-3'], "unknown config key 'learning_rat' (did you mean 'learning_rate'?)"),
    (['--n_layer=2.5'], "n_layer must be int, got 2.5 (float)"),
    (['--n_layer=True'], "n_layer must be int"),
    (['--learning_rate=fast'], "learning_rate must be float, got 'fast'"),
    (['--window=4.0'], "window must be int or list"),
    (['--compile=1'], "compile must be bool or NoneType"),
    (['--flag'], "expected --key=value"),
    (['--schedule=linear'], "schedule must be one of ['wsd', 'cosine'], got 'linear'"),
    (['--schedule=1'], "schedule must be one of ['wsd', 'cosine'], got 1"),
    (['--PROJECTIONS=()'], "unknown config key 'PROJECTIONS'"),
    (['missing_config.py'], "cannot read config file missing_config.py"),
])
def test_errors_name_the_problem(argv, message):
    with pytest.raises(SystemExit) as e:
        configure(dict(DEFAULTS), argv)
    assert message in str(e.value)


def test_unknown_key_in_a_file(tmp_path):
    f = tmp_path / 'c.py'
    f.write_text("n_layers = 4\n")
    with pytest.raises(SystemExit,
                       match=r"c.py\): unknown config key 'n_layers' \(did you mean 'n_layer'\?\)"):
        configure(dict(DEFAULTS), [str(f)])


SCRIPTS = ['train.py', 'eval_loss.py', 'eval_niah.py', 'eval_ruler.py', 'tools/eval_helmet.py',
           'average_ckpts.py', 'tools/probe_variance.py', 'tools/export_hf.py', 'tools/bench.py',
           'tools/study.py', 'tools/gpu_check.py']


def test_help_lists_every_key_with_its_default_and_comment(capsys, monkeypatch):
    """--help, generated from the script's own globals and comments: train.py's every key, the
    model keys among them with the comments of their config dataclass; every script's keys."""
    import dataclasses
    import os
    import runpy

    import checkpoint
    from conftest import ROOT
    listed = {}
    # in this process: the scripts stop at configure(), before doing anything
    for script in SCRIPTS:
        monkeypatch.setattr('sys.argv', [script, '--help'])
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(os.path.join(ROOT, script), run_name='__main__')
        out = capsys.readouterr().out
        assert stop.value.code == 0 and out.startswith('usage: python '), (script, out[-500:])
        listed[script] = dict(line.strip()[2:].split('=', 1) for line in out.splitlines()
                              if line.startswith('  --'))
    train = listed['train.py']
    MODELS = [checkpoint.model_class(t)[1] for t in checkpoint.MODEL_TYPES]
    fields = {f.name for cfg in MODELS for f in dataclasses.fields(cfg)}
    assert fields <= set(train) and {'wandb_log', 'tokens_per_batch', 'init_from'} <= set(train)
    # each key of train.py's config block with the comment of its line there, not of a later
    # assignment (n_layer is set again per model type below the block)
    source = open(os.path.join(ROOT, 'train.py')).read().split('# ' + '-' * 77)[1]
    block = [line.split('#', 1) for line in source.splitlines()
             if '=' in line.split('#')[0] and '#' in line and not line.startswith((' ', '#'))]
    for code, comment in block:
        key = re.match(r'\w+', code).group(0)
        assert train[key].split('  # ', 1)[1] == comment.strip(), key
    assert len(block) > 70
    # the paper's keys, written out in train.py: the models' own defaults
    for key in ('dropout', 'dropout_type', 'vpad_variant', 'attn_dropout', 'pos_encoding', 'window',
                'attn_alpha', 'attn_scale'):
        defaults = {f.default for cfg in MODELS
                    for f in dataclasses.fields(cfg) if f.name == key}
        assert [repr(d) for d in defaults] == [train[key].split('  # ')[0]], key
    assert train['batch_size'].startswith('16  # ') and train['d_state'].startswith('128  # ')
    assert {'ckpt', 'lengths', 'samples', 'essay'} <= set(listed['eval_ruler.py'])
    assert all(listed[s] for s in SCRIPTS)
    # constants (probe_variance's PROJECTIONS) are no keys
    assert not [k for s in SCRIPTS for k in listed[s] if k.isupper()]
    # apart: run here it would register its lm-eval model a second time
    if importlib.util.find_spec('lm_eval'):
        import subprocess
        import sys
        r = subprocess.run([sys.executable, '-m', 'tools.eval_lm', '--help'], cwd=ROOT,
                           capture_output=True, text=True)
        assert (r.returncode == 0 and '--tasks=' in r.stdout
                and '--ckpt=' in r.stdout), r.stderr[-500:]
