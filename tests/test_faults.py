"""No run is lost or stuck: kill -9 at any moment, a divergence, a full disk, a second writer, a
killed torchrun. Each test runs train.py as a user would and checks what is left on disk."""

import fcntl
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import checkpoint
import ruler
from conftest import ROOT, TINY, read_log, run_script, run_train

# train.py with the batches of one step replaced by a byte the data never holds (300, inside the
# padded vocabulary): a loss spike from the data, the kind that skipping the batches cures
SPIKE = ("""
import runpy, sys, tokens
batch = tokens.TokenData.batch
def spiky(self, batch_size, T, rng):
    x, y = batch(self, batch_size, T, rng)
    if list(rng.bit_generator.seed_seq.entropy)[1:3] == [0, {step}]:"""
         """  # batch_rng(seed, 0, step, j): training
        y = y * 0 + 300
    return x, y
tokens.TokenData.batch = spiky
sys.argv = ['train.py', *sys.argv[1:]]
runpy.run_path('train.py', run_name='__main__')
""")


def spiky_train(step, *args):
    return subprocess.run([sys.executable, '-c', SPIKE.format(step=step), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def step_losses(out):
    """{step: the training loss of the weights at that step} (log.jsonl's train record of iteration
    s + 1 holds the loss of step s), from the newest session that logged the step."""
    return {x['iter'] - 1: x['loss'] for x in read_log(out)}


def test_every_saved_checkpoint_passed_the_spike_check(tiny_data, tmp_path):
    """A learning rate far too high: the run stops, and every checkpoint it saved on the way is one
    whose loss passed the check, from the first step on: within spike_threshold (1) of the first
    loss while fewer than 5 are recorded, then of the lowest of the last 20."""
    out = str(tmp_path)
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--learning_rate=1.0',
                  '--warmup_frac=0.5', '--ckpt_interval=1', '--eval_lengths=[]')
    assert r.returncode == 1 and 'stopping at iteration' in r.stdout, r.stdout[-2000:]
    losses, stopped = step_losses(out), read_log(out, 'diverged')[0]['iter']
    assert checkpoint.steps(out) == list(range(1, stopped))
    for s in checkpoint.steps(out):
        before = [losses[t] for t in range(max(0, s - 20), s)]
        assert losses[s] <= (min(before) if len(before) >= 5 else losses[0]) + 1.0, (s, losses)


def test_a_data_spike_is_skipped_on_resume(tiny_data, tmp_path):
    """The batches of step 11 spike the loss: the run stops there without saving, names checkpoint
    10 (whose loss passed the check) and the flag that skips the batches of iterations 10-11. A
    resume without it would replay the spike, and is refused before anything is written; with
    it the run finishes, and the skip is kept in the checkpoints (a later resume keeps it)."""
    out = str(tmp_path)
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--max_tokens=4096',
            '--ckpt_interval=2', '--eval_lengths=[]')
    r = spiky_train(11, *args)
    assert (r.returncode == 1
            and 'stopping at iteration 11' in r.stdout), r.stdout[-2000:] + r.stderr[-2000:]
    assert (f'The last good checkpoint is {checkpoint.step_path(out, 10)}' in r.stdout
            and '--skip_steps=2' in r.stdout)
    losses = step_losses(out)
    # the named checkpoint passed the check
    assert losses[10] < min(losses[t] for t in range(10)) + 1.0
    log = open(os.path.join(out, 'log.jsonl')).read()
    r = spiky_train(11, *args, '--init_from=resume')
    assert (r.returncode != 0 and 'would replay the divergence at iteration 11' in r.stderr
            and '--skip_steps=2' in r.stderr)
    assert open(os.path.join(out, 'log.jsonl')).read() == log and 'Traceback' not in r.stderr
    r = spiky_train(11, *args, '--init_from=resume', '--skip_steps=2', '--halt_at=14')
    assert (r.returncode == 0
            and 'skipping batches: from iteration 10 the next 2' in r.stdout), r.stderr[-2000:]
    assert checkpoint.load(checkpoint.step_path(out, 14))['skips'] == [[10, 2]]
    r = spiky_train(11, *args, '--init_from=resume')  # the spike's batches stay skipped
    assert (r.returncode == 0
            and 'skipping batches: from iteration 10 the next 2' in r.stdout), r.stderr[-2000:]
    assert checkpoint.steps(out)[-1] == 16 and len(read_log(out, 'diverged')) == 1


def killed_and_resumed(args, out, trial):
    """train.py into out, killed (-9) at a random moment while it trains (even trials) or as a
    checkpoint's temporary file appears (odd ones, each after more checkpoints), then resumed
    (or started again, if no checkpoint was saved) -> the resume's CompletedProcess."""
    p = subprocess.Popen([sys.executable, 'train.py', *args, f'--out_dir={out}'], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while p.poll() is None and not os.path.exists(out / 'log.jsonl') and time.time() < deadline:
        time.sleep(0.001)
    moment = time.time() + random.Random(trial).uniform(0, 0.6)
    while p.poll() is None and time.time() < deadline:
        if ((glob.glob(str(out / '*.tmp')) and len(checkpoint.steps(str(out))) >= trial // 2)
                if trial % 2 else time.time() >= moment):
            p.kill()
            break
        time.sleep(0.0005)
    p.wait()
    # and what a kill leaves when the resumed run does not write that step again (say it halts
    # before)
    (out / 'optim_999999.pt.tmp').write_bytes(b'half an optimizer state')
    # a process of its own: two trials run at a time, and train.py in this process is not
    # thread-safe (sys.argv, stdout, torch's global generator are the process's)
    init = 'resume' if checkpoint.steps(str(out)) else 'scratch'
    return subprocess.run([sys.executable, 'train.py', *args, f'--out_dir={out}',
                           f'--init_from={init}'],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_kill_at_random_moments_loses_nothing(tiny_data, tmp_path):
    """kill -9 at 10 moments (killed_and_resumed; two trials at a time), each followed by a resume:
    every file left loads, no temporary file survives the resume, and every loss logged (before
    and after the kill) is the uninterrupted run's, as is the final checkpoint."""
    from concurrent.futures import ThreadPoolExecutor
    args = (*TINY, f'--data_dir={tiny_data}', '--ckpt_interval=1', '--eval_lengths=[]',
            '--eval_iters=1')
    assert run_train(*args, f'--out_dir={tmp_path}/straight').returncode == 0
    want = checkpoint.load(checkpoint.step_path(str(tmp_path / 'straight'), 8))['model']
    want_losses = {x['iter']: x['loss'] for x in read_log(str(tmp_path / 'straight'))}
    with ThreadPoolExecutor(2) as pool:
        resumes = list(pool.map(lambda t: killed_and_resumed(args, tmp_path / f'killed{t}', t),
                                range(10)))
    for trial, r in enumerate(resumes):
        out = tmp_path / f'killed{trial}'
        assert r.returncode == 0, r.stderr[-2000:]
        assert not glob.glob(str(out / '*.tmp'))
        for f in glob.glob(str(out / '*.pt')):
            checkpoint.load(f)
        assert all(x['loss'] == want_losses[x['iter']] for x in read_log(str(out)))
        got = checkpoint.load(checkpoint.step_path(str(out), 8))['model']
        assert all(torch.equal(want[k], got[k]) for k in want)
    assert all('removed optim_999999.pt.tmp, left by an interrupted write' in r.stdout
               for r in resumes)
    # kills in a write left a .tmp
    assert sum(r.stdout.count('left by an interrupted write') > 1 for r in resumes) >= 3


def locked(path):
    """Whether a process holds the lock file at path (checkpoint.lock's flock)."""
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # closing f lets it go


def live_processes(marker):
    """pids of the processes (not zombies) whose command line holds marker."""
    pids = []
    for d in glob.glob('/proc/[0-9]*'):
        try:
            cmdline = open(f'{d}/cmdline', 'rb').read().decode(errors='replace')
            state = next(line for line in open(f'{d}/status') if line.startswith('State:'))
        except (OSError, StopIteration):
            continue
        if marker in cmdline and 'Z' not in state.split()[1]:
            pids.append(int(d.rsplit('/', 1)[1]))
    return pids


@pytest.mark.skipif(sys.platform != 'linux', reason='PR_SET_PDEATHSIG is Linux only')
def test_one_writer_per_out_dir_and_none_after_torchrun_is_killed(tiny_data, tmp_path):
    """While a run trains (torchrun, 2 processes), a second run into its folder is refused and
    names the writer's pid. torchrun starts its workers in sessions of their
    own: killing torchrun's process group (kill -9) must end them too, not leave them writing into
    out_dir; then the folder is free and the resume goes on."""
    out = tmp_path / 'run'
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--max_tokens=1e6',
            '--ckpt_interval=5', '--eval_lengths=[]', '--log_interval=1')
    p = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                          '--nproc_per_node=2', 'train.py', *args], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    try:
        deadline = time.time() + 120
        while not checkpoint.steps(str(out), 'optim') and time.time() < deadline:
            time.sleep(0.05)
        assert len(live_processes(str(out))) == 3  # torchrun and its two workers
        writer = open(out / 'lock').read().strip()
        assert int(writer) in live_processes(str(out))  # rank 0
        # refused at once (not: trains on beside the writer; a process of its own, so that a lock
        # that failed would time out here rather than train 1e6 tokens in the test's process)
        r = subprocess.run([sys.executable, 'train.py', *args, '--init_from=resume'], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode != 0
                and f'is in use by another run (pid {writer})' in r.stderr), r.stderr[-2000:]
        assert 'Traceback' not in r.stderr
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 20  # the workers gone, and their lock with them
        while (live_processes(str(out)) or locked(out / 'lock')) and time.time() < deadline:
            time.sleep(0.1)
        assert not live_processes(str(out)) and not locked(out / 'lock')
    finally:
        for pid in live_processes(str(out)):
            os.kill(pid, signal.SIGKILL)
    step = checkpoint.steps(str(out), 'optim')[-1]
    r = run_train(*args, '--init_from=resume', f'--halt_at={step + 1}')
    assert r.returncode == 0 and 'resuming' in r.stdout, r.stderr[-2000:]


def test_checkpoint_save_on_a_full_disk(tmp_path, monkeypatch):
    """torch.save reports a full disk as an obscure RuntimeError of its writer: save() removes its
    temporary file and says what happened, with the bytes needed; the previous file stays whole."""
    import collections
    path = str(tmp_path / 'ckpt_000001.pt')
    checkpoint.save({'step': 1}, path)

    def full(obj, f):
        f.write(b'part of a checkpoint')
        raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598')
    usage = collections.namedtuple('usage', 'total used free')
    monkeypatch.setattr(checkpoint.torch, 'save', full)
    monkeypatch.setattr(checkpoint.shutil, 'disk_usage',
                        lambda p: usage(10 ** 6, 10 ** 6 - 100, 100))
    with pytest.raises(OSError,
                       match=rf'the disk is full: {path} needs about 4,000 bytes, 100 are free'):
        checkpoint.save({'step': 2, 'w': torch.zeros(1000)}, path)
    assert checkpoint.load(path) == {'step': 1} and os.listdir(tmp_path) == ['ckpt_000001.pt']


def test_a_full_disk_stops_with_the_last_pair_intact(tiny_data, tmp_path):
    """A run on a small disk (tmpfs) that fills up: the checkpoint that does not fit stops the run
    in one line that says so; the pair before it and nothing else is left, and once there is space
    the resume finishes the run."""
    disk = tmp_path / 'disk'
    disk.mkdir()
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(disk)],
                      capture_output=True).returncode:
        pytest.skip('cannot mount a tmpfs here (needs root)')
    try:
        out = str(disk / 'run')
        args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--ckpt_interval=2',
                '--eval_lengths=[]')
        assert run_train(*args, '--halt_at=4').returncode == 0
        with open(disk / 'filler', 'wb') as f:  # fill the disk
            try:
                while True:
                    f.write(b'\0' * 65536)
                    f.flush()
            except OSError:
                pass
        r = run_train(*args, '--init_from=resume')
        assert r.returncode != 0 and ('stopping at iteration 6: cannot save its checkpoint'
                                      in r.stderr), r.stderr[-2000:]
        assert ('the disk is full' in r.stderr and 'needs about' in r.stderr
                and 'Traceback' not in r.stderr)
        assert sorted(os.listdir(out)) == ['ckpt_000002.pt', 'ckpt_000004.pt', 'lock', 'log.jsonl',
                                           'optim_000002.pt', 'optim_000004.pt']
        os.remove(disk / 'filler')
        r = run_train(*args, '--init_from=resume')
        assert r.returncode == 0 and checkpoint.steps(out)[-1] == 8, r.stderr[-2000:]
    finally:
        subprocess.run(['umount', '-l', str(disk)])  # lazily: a file still open keeps it busy


# -----------------------------------------------------------------------------
# no tool deletes or replaces what it did not write; no stale result; a resume past a cut log line

def snapshot(folder):
    """name -> bytes of every file in folder (what a refused command must leave as it was)."""
    return {n: open(os.path.join(folder, n), 'rb').read() for n in sorted(os.listdir(folder))}


def test_export_and_average_never_write_over_a_run(tiny_run, tmp_path):
    """tools/export_hf.py into a run folder (another run's, or the checkpoint's own) and
    average_ckpts.py onto a run's checkpoint or optimizer state are refused in one line, the run
    left byte for byte; an earlier average is replaced only with --overwrite=True."""
    before = snapshot(tiny_run)
    ckpt, older = checkpoint.step_path(tiny_run, 8), checkpoint.step_path(tiny_run, 4)
    optim = checkpoint.step_path(tiny_run, 8, 'optim')
    other = tmp_path / 'other'
    shutil.copytree(tiny_run, other)
    cases = [('tools/export_hf.py', f'--ckpt={ckpt}', f'--out={other}'),
             ('tools/export_hf.py', f'--ckpt={ckpt}', f'--out={tiny_run}'),
             ('tools/export_hf.py', f'--ckpt={ckpt}', f'--out={tiny_run}/'),
             ('average_ckpts.py', f'--ckpt_dir={tiny_run}', '--steps=[8]', f'--out={older}'),
             ('average_ckpts.py', f'--ckpt_dir={tiny_run}', '--steps=[8]', f'--out={optim}')]
    for name, *args in cases:
        code, message = run_script(name, *args)
        assert code == 1 and "a training run's file or folder" in message, (args, message)
        assert '\n' not in message
    assert snapshot(tiny_run) == before and snapshot(other) == before
    mine = tmp_path / 'export.tmp'  # a user's folder where the old export wrote its temporary one
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    code, message = run_script('tools/export_hf.py', f'--ckpt={ckpt}', f'--out={tmp_path}/export')
    assert code == 1 and "SmolLM3's layout needs" in message  # a NAPE model: refused after it began
    assert (mine / 'notes.txt').read_text() == 'mine' and not os.path.exists(tmp_path / 'export')
    # nothing of its own left
    assert sorted(p.name for p in tmp_path.glob('*.tmp')) == ['export.tmp']

    def average(*args):
        return run_script('average_ckpts.py', f'--ckpt_dir={tiny_run}', *args)
    avg = str(tmp_path / 'avg.pt')
    assert average('--last=2', f'--out={avg}') == (0, '')
    code, message = average('--last=1', f'--out={avg}')
    assert code == 1 and 'an earlier output of average_ckpts.py: --overwrite=True' in message
    assert checkpoint.load(avg)['averaged_steps'] == [4, 8]
    assert average('--last=1', f'--out={avg}', '--overwrite=True')[0] == 0
    assert checkpoint.load(avg)['averaged_steps'] == [8]
    code, message = average('--last=1', f'--out={tmp_path}', '--overwrite=True')  # a user's folder
    assert code == 1 and 'was not written by average_ckpts.py' in message
    assert sorted(p.name for p in tmp_path.glob('*.tmp')) == ['export.tmp']  # the user's, whole


def test_two_runs_started_together_on_a_new_folder(tiny_data, tmp_path):
    """Started at once on a new out_dir: exactly one trains, the other is refused naming it, and
    the run's checkpoints and log are the one run's (not another model's written over them). The
    larger model is slower to start: before the lock came first, it took the folder after the
    other run had ended (1 time in 2 here)."""
    out = str(tmp_path / 'new')
    args = (*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--eval_lengths=[]',
            '--halt_at=2', '--spike_threshold=0')
    procs = [subprocess.Popen([sys.executable, 'train.py', *args, f'--n_embd={n}'], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (32, 1536)]
    results = [(p.communicate(timeout=300)[1], p.returncode)[::-1] for p in procs]
    assert sorted(code for code, _ in results) == [0, 1], results
    refused = next(err for code, err in results if code)
    # by the lock; or, where a loaded machine starts the second after the first has ended, by the
    # first's checkpoints (never over them)
    assert ('is in use by another run' in refused or 'already holds checkpoints' in refused) \
        and 'Traceback' not in refused
    starts = read_log(out, 'start')
    assert len(starts) == 1
    trained = checkpoint.load(checkpoint.step_path(out, 2))['model_args']['n_embd']
    assert trained == starts[0]['config']['n_embd']


def test_a_refused_run_leaves_no_folder(tiny_data, tmp_path):
    """A run refused after it took a new out_dir's lock (its CPT source does not exist) leaves
    nothing: not the lock, not the folder."""
    out = tmp_path / 'new'
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--eval_lengths=[]',
                  "--init_from=/nonexistent/ckpt.pt")
    assert r.returncode == 1 and 'init_from must be' in r.stderr and not out.exists()


def test_resume_passes_over_a_cut_log_line_and_a_bad_optimizer_state(tiny_run, tiny_data, tmp_path):
    """A log.jsonl whose last line a kill cut short, and a newest optimizer state that holds no
    optimizer (an average written over it): the resume says so, goes back to the pair before, and
    finishes; the cut line is ended, so that every later record reads."""
    out = str(tmp_path / 'run')
    shutil.copytree(tiny_run, out)
    with open(os.path.join(out, 'log.jsonl'), 'a') as f:
        f.write('{"event": "train", "iter": 9, "lo')
    checkpoint.save({'model': {}, 'averaged_from': []}, checkpoint.step_path(out, 8, 'optim'))
    r = run_train(*TINY, f'--data_dir={tiny_data}', f'--out_dir={out}', '--init_from=resume',
                  '--eval_lengths=[]')
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'passing over step 8' in r.stdout and 'resuming' in r.stdout
    assert 'at iteration 4' in r.stdout
    assert 'passing over line' in r.stdout
    lines = open(os.path.join(out, 'log.jsonl')).read().splitlines()
    cut = [i for i, line in enumerate(lines) if line.endswith('"lo')]
    assert len(cut) == 1 and [json.loads(line)['session'] for line in lines[cut[0] + 1:]][0] == 1


def test_saved_results_are_read_back_only_under_their_settings(tiny_run, tmp_path):
    """eval_niah.py with --window=4, then with --window=0 at the same --out: not the window-4
    predictions reported as window 0, but a one-line refusal naming the difference, the results
    untouched; --overwrite=True recomputes them; the same settings again read them back."""
    ckpt, out = checkpoint.step_path(tiny_run, 8), str(tmp_path / 'o' / 'r')
    args = (f'--ckpt={ckpt}', '--lengths=[1024]', '--samples=1', '--depths=[]', f'--out={out}')
    assert run_script('eval_niah.py', *args, '--window=4') == (0, '')
    saved = open(out + '.jsonl').read()
    assert json.loads(saved.splitlines()[0])['settings']['window'] == 4
    for change, diff in (('--window=0', 'window: 4 there, 0 now'),
                         ('--seed=1', 'seed: 42 there, 1 now'),
                         ("--overrides={'rope_factor': 2.0}",
                          "overrides: None there, {'rope_factor': 2.0} now")):
        code, message = run_script('eval_niah.py', *args, '--window=4', change)  # the later wins
        assert code == 1 and f'holds results of other settings ({diff})' in message, message
        assert open(out + '.jsonl').read() == saved
    assert run_script('eval_niah.py', *args, '--window=0', '--overwrite=True')[0] == 0
    recomputed = open(out + '.jsonl').read()
    assert json.loads(recomputed.splitlines()[0])['settings']['window'] == 0
    assert run_script('eval_niah.py', *args, '--window=0')[0] == 0
    assert open(out + '.jsonl').read() == recomputed  # read back: no row added


def test_results_file_checks(tmp_path):
    """ruler.Results: a file that is not ours is refused (also with overwrite), a row cut short by a
    kill is dropped, a corrupt row inside is named; different weights refuse like any setting."""
    path = str(tmp_path / 'r.jsonl')
    open(path, 'w').write('{"event": "start", "iter": 0}\n')  # e.g. another run's log
    for overwrite in (False, True):
        with pytest.raises(SystemExit, match='is not a results file with settings'):
            ruler.Results(path, {'a': 1}, overwrite)
    os.remove(path)
    results = ruler.Results(path, {'weights': 'x', 'window': (4,)})
    assert not os.path.exists(path)  # nothing written before the first row
    results.add({'id': 'a', 'score': 1})
    results.add({'id': 'b', 'score': 0})
    with open(path, 'a') as f:
        f.write('{"id": "c", "sc')
    again = ruler.Results(path, {'weights': 'x', 'window': [4]})
    assert list(again.rows) == ['a', 'b'] and open(path).read().endswith('"score": 0}\n')
    with pytest.raises(SystemExit, match=r"other settings \(weights: 'x' there, 'y' now\)"):
        ruler.Results(path, {'weights': 'y', 'window': [4]})
    lines = open(path).read().splitlines()
    open(path, 'w').write('\n'.join([lines[0], 'garbage', lines[1]]) + '\n')
    with pytest.raises(SystemExit, match='line 2 of .* is not a result row'):  # any settings
        ruler.Results(path, {'weights': 'x', 'window': [4]})
