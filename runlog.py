"""
A training run's record: out_dir/log.jsonl, one JSON line per event (start, train, eval,
diverged), each whole or not at all, and with wandb_log the same numbers in Weights & Biases.
Every record names its session (0 for the first start, 1 after the first resume, ...), so the
steps that a resumed run repeats can be told from the ones before the interruption.
"""

import json
import os
import uuid

# the keys that do not change what a run trains (a resume that changes only these replays it)
NOT_TRAINING = ('init_from', 'halt_at', 'skip_steps', 'log_interval', 'eval_interval',
                'ckpt_interval', 'keep_last', 'eval_iters', 'eval_lengths', 'eval_windows',
                'task_eval_samples', 'wandb_log', 'wandb_project', 'wandb_run_name')


class RunLog:
    def __init__(self, out_dir, master=True, wandb_log=False):
        self.out_dir, self.path = out_dir, os.path.join(out_dir, 'log.jsonl')
        self.master, self.wandb = master, None
        self.wandb_log, self.session = wandb_log, 0
        if wandb_log:
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise SystemExit("config error: wandb_log=True needs wandb: pip install wandb "
                                 "(or no wandb_log)")

    def records(self):
        """Every record that reads; a line cut short by a kill during its write is passed over."""
        records = []
        for n, line in enumerate(open(self.path) if os.path.exists(self.path) else [], 1):
            try:
                records.append(json.loads(line))
            except ValueError:
                print(f"note: passing over line {n} of {self.path}, cut short by an interrupted "
                      f"write", flush=True)
        return records

    def check_replay(self, start_iter, config, skipping):
        """SystemExit if this resume would replay the divergence that ended the run's last session:
        it starts before that iteration with the same training config and skips no batches."""
        records = self.records()
        last = records[-1] if records else {}
        if last.get('event') != 'diverged' or skipping or last['iter'] <= start_iter:
            return
        before = last.get('config', {})
        if all(before.get(k) == v for k, v in config.items() if k not in NOT_TRAINING):
            replayed, skip = last['iter'], last['iter'] - start_iter + 1
            raise SystemExit(f"this resume from iteration {start_iter} would replay the divergence "
                             f"at iteration {replayed} (the same config, the same batches): skip "
                             f"the batches that led to it with --skip_steps={skip}, or change "
                             f"the training (e.g. a lower learning_rate); --skip_steps=0 replays "
                             f"it all the same")

    def start(self, it, config, project, name):
        """This session's number, its wandb run (a resumed run continues the wandb run whose id is
        kept in out_dir), and its start record."""
        if not self.master:
            return
        if os.path.exists(self.path):  # counted by text: a line cut short by a kill still counts
            self.session = sum(1 for line in open(self.path) if '"event": "start"' in line)
            with open(self.path, 'rb+') as f:  # a cut last line is ended: the next starts anew
                end = f.seek(0, os.SEEK_END)
                f.seek(max(end - 1, 0))
                if end and f.read(1) != b'\n':
                    f.write(b'\n')
        if self.wandb_log:
            import wandb
            id_file = os.path.join(self.out_dir, 'wandb_id')
            run_id = uuid.uuid4().hex[:8]  # a new wandb run, or the one of out_dir
            if os.path.exists(id_file):
                run_id = open(id_file).read().strip()
            name = name or os.path.basename(os.path.abspath(self.out_dir))
            wandb.init(project=project, name=name, config=config, dir=self.out_dir, id=run_id,
                       resume='allow')
            with open(id_file, 'w') as f:
                f.write(run_id)
            self.wandb = wandb
        self({'event': 'start', 'iter': it, 'config': config})

    def __call__(self, record):
        """Append one line, whole or not at all (a full disk: a warning, the run goes on); with
        wandb, its numbers too (position_loss/128-256, accuracy/64, ...)."""
        if not self.master:
            return
        if self.wandb and record['event'] in ('train', 'eval'):
            flat = {f"{k}/{band}" if isinstance(v, dict) else k: x
                    for k, v in record.items() if k not in ('event', 'iter')
                    for band, x in (v.items() if isinstance(v, dict) else [(None, v)])
                    if isinstance(x, (int, float))}
            self.wandb.log(flat, step=record['iter'])
        line = (json.dumps({**record, 'session': self.session}) + '\n').encode()
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        try:
            with open(self.path, 'ab') as f:
                f.write(line)
                f.flush()
        except OSError as e:
            with open(self.path, 'ab') as f:
                f.truncate(size)
            print(f"warning: could not write to {self.path} ({e}); the record of iteration "
                  f"{record.get('iter')} is lost", flush=True)
