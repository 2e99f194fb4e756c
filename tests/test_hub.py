"""Released weights by their Hugging Face name: `init_from` and `--ckpt` take a repo id (optionally
@revision), resolved through huggingface_hub's cache; offline here, on a cache the test lays out
as huggingface_hub does (models--org--name/refs/main -> snapshots/<commit>/)."""

import os
import shutil
import subprocess
import sys

import pytest

import weights
from conftest import ROOT
from test_smollm3 import cpt_setup

COMMIT = 'a' * 40


def offline(cache):
    return {**os.environ, 'HF_HUB_CACHE': str(cache), 'HF_HUB_OFFLINE': '1'}


def lay_out(cache, repo, folder, commit=COMMIT):
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, root / 'snapshots' / commit)
    (root / 'refs').mkdir()
    (root / 'refs' / 'main').write_text(commit)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """huggingface_hub pointed at an empty cache under tmp_path, offline (as HF_HUB_OFFLINE=1)."""
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    return tmp_path / 'hub'


def test_a_repo_id_resolves_through_the_hub_cache(tmp_path, hub):
    folder, args = cpt_setup(tmp_path)
    cache = hub
    lay_out(cache, 'TinyOrg/smol-3', folder)
    snapshot = str(cache / 'models--TinyOrg--smol-3' / 'snapshots' / COMMIT)
    assert weights.local('TinyOrg/smol-3') == weights.local(f'TinyOrg/smol-3@{COMMIT}') == snapshot
    # not cached, and offline: what to do, in one line
    for name in ('TinyOrg/absent', 'TinyOrg/smol-3@v9'):
        with pytest.raises(ValueError,
                           match=r'download it once online \(huggingface-cli download TinyOrg/'):
            weights.local(name)
    assert (weights.local(str(folder)) == str(folder)
            and weights.local('out/ckpt_000008.pt') == 'out/ckpt_000008.pt')
    # train.py's CPT from the hub name, the same run as from the folder
    args = [a if not a.startswith('--init_from') else '--init_from=TinyOrg/smol-3' for a in args]
    r = subprocess.run([sys.executable, 'train.py', *args, f'--out_dir={tmp_path / "cpt"}',
                        '--max_tokens=512'],
                       cwd=ROOT, capture_output=True, text=True, env=offline(cache))
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'continued pre-training from TinyOrg/smol-3' in r.stdout
    r = subprocess.run([sys.executable, 'train.py', *args[:-1], '--init_from=TinyOrg/absent',
                        f'--out_dir={tmp_path / "x"}'],
                       cwd=ROOT, capture_output=True, text=True, env=offline(cache))
    assert (r.returncode != 0 and 'huggingface-cli download TinyOrg/absent' in r.stderr
            and 'Traceback' not in r.stderr)
    assert not os.path.exists(tmp_path / 'x')  # nothing written


def test_a_missing_local_path_says_both(hub, tmp_path, monkeypatch):
    # an empty working directory: out/quickstart exists after the quick start
    monkeypatch.chdir(tmp_path)
    # a typo'd folder reads as a repo id: the message covers both
    for name in ('out/quickstart', 'no-such/folder'):
        with pytest.raises(ValueError, match='no local file or folder'):
            weights.local(name)
