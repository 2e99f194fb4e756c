"""Every bad input is a one-line error, said before anything is written: a table of command lines
over the scripts and tools, each with (part of) the message it must print. Each runs in this process
(conftest.run_script: no torch import per case); anything but a SystemExit fails the test, and so
does a file created or changed anywhere under the test's folders or at the repository's root."""

import json
import os
import pickle
import re
import shutil

import pytest
import torch

import checkpoint
from conftest import ROOT, TINY, run_script
from mamba import Mamba2, Mamba2Config

TRAIN = (*TINY, '--data_dir={data}', '--out_dir={tmp}/out')  # would train, but for the bad input

CASES = [
    # train.py: ranges and types of the keys
    ('train.py', '--block_size=0', 'block_size must be >= 1'),
    ('train.py', '--block_size=-3', 'block_size must be >= 1'),
    ('train.py', '--seed=-1', 'seed must be >= 0'),
    ('train.py', '--vocab_size=10', 'vocab_size = 10 is less than the data'),
    ('train.py', '--train_tokens=-5', 'train_tokens must be >= 0'),
    ('train.py', '--n_layer=0', 'sizes must be >= 1'),
    ('train.py', '--n_layer=-1', 'sizes must be >= 1'),
    ('train.py', '--n_head=0', 'sizes must be >= 1'),
    ('train.py', '--n_embd=0', 'sizes must be >= 1'),
    ('train.py', '--n_head=3', 'must be a multiple of n_head'),
    ('train.py', '--n_kv_head=3', 'must be a multiple of n_kv_head'),
    ('train.py', '--n_embd=1048576', 'the run does not fit'),
    ('train.py', '--eval_iters=0', 'eval_iters must be >= 1'),
    ('train.py', '--eval_windows=0', 'eval_windows must be >= 1'),
    ('train.py', '--eval_lengths=[-5]', 'each of eval_lengths must be >= 1'),
    ('train.py', '--eval_lengths=[32.5]', 'eval_lengths must be list[int]'),
    ('train.py', '--eval_lengths=5', 'eval_lengths must be list[int]'),
    ('train.py', '--grad_clip=-1', 'grad_clip must be >= 0'),
    ('train.py', '--spike_threshold=-1', 'spike_threshold must be >= 0'),
    ('train.py', '--log_interval=0', 'log_interval must be >= 1'),
    ('train.py', '--eval_interval=0', 'eval_interval must be >= 1'),
    ('train.py', '--ckpt_interval=0', 'ckpt_interval must be >= 1'),
    ('train.py', '--batch_size=0', 'batch_size must be >= 1'),
    ('train.py', '--keep_last=-1', 'keep_last must be >= 0'),
    ('train.py', '--halt_at=-1', 'halt_at must be >= 0'),
    ('train.py', '--skip_steps=-1', 'skip_steps must be >= 0'),
    ('train.py', '--skip_steps=2', 'skips batches of a resumed run'),
    ('train.py', '--learning_rate=0', 'learning_rate and min_lr must be positive'),
    ('train.py', '--learning_rate=-1', 'learning_rate and min_lr must be positive'),
    ('train.py', '--learning_rate=1e39', 'finite in float32'),
    ('train.py', '--min_lr=-1', 'learning_rate and min_lr must be positive'),
    ('train.py', '--warmup_frac=-0.1', 'warmup_frac must be >= 0'),
    ('train.py', '--anneal_frac=2', 'anneal_frac must be >= 0 and <= 1'),
    ('train.py', '--warmup_frac=0.9 --anneal_frac=0.5', 'warm-up plus anneal at most 1'),
    ('train.py', '--beta1=1.0', 'beta1 must be >= 0'),
    ('train.py', '--beta2=-0.5', 'beta2 must be >= 0'),
    ('train.py', '--weight_decay=-0.1', 'weight_decay must be >= 0'),
    ('train.py', '--max_tokens=10', 'less than one step'),
    ('train.py', '--max_tokens=-1', 'max_tokens must be >= 1'),
    ('train.py', '--tokens_per_batch=100', 'positive multiple of block_size'),
    ('train.py', '--tokens_per_batch=0', 'tokens_per_batch must be >= 1'),
    ('train.py', '--dropout=1.0', 'dropout must be in [0, 1)'),
    ('train.py', '--dropout=-0.1', 'dropout must be in [0, 1)'),
    ('train.py', '--dropout_type=foo', "unknown dropout_type 'foo'"),
    ('train.py', '--vpad_variant=Z', "unknown vpad_variant 'Z'"),
    ('train.py', '--attn_dropout=1.5', 'attn_dropout must be in [0, 1)'),
    ('train.py', '--pos_encoding=foo', "unknown pos_encoding 'foo'"),
    ('train.py', '--pos_encoding=[]', 'pos_encoding has 0 entries'),
    ('train.py', '--window=-1', 'window must be >= 0'),
    ('train.py', '--mlp=relu', "mlp must be one of ('gelu', 'swiglu'), got 'relu'"),
    ('train.py', '--norm=batch', "norm must be one of ('rmsnorm', 'layernorm')"),
    ('train.py', '--attn_alpha=0.5', 'attn_alpha must be >= 1'),
    ('train.py', '--attn_scale=foo', 'attn_scale must be one of'),
    ('train.py', '--attn_backend=foo', 'attn_backend must be'),
    ('train.py', '--rope_factor=0.5', 'rope_factor >= 1'),
    ('train.py', '--rope_scaling=foo', "rope_scaling must be one of ('none', 'pi', 'yarn')"),
    ('train.py', '--model_type=mamba2 --d_state=0', 'sizes must be >= 1'),
    ('train.py', '--model_type=mamba2 --headdim=7', 'must be a multiple of headdim'),
    ('train.py', '--task=foo', "task must be one of"),
    ('train.py', '--schedule=linear', "schedule must be one of"),
    ('train.py', '--model_type=rnn', "model_type must be one of"),
    ('train.py', '--parallel=foo', "parallel must be one of"),
    ('train.py', '--dtype=garbage', "dtype must be one of"),
    ('train.py', '--compile=maybe', 'compile must be bool or NoneType'),
    ('train.py', '--block_size=abc', 'block_size must be int'),
    ('train.py', '--unknown_key=1', "unknown config key 'unknown_key'"),
    ('train.py', '--n_layr=2', "did you mean 'n_layer'"),
    ('train.py', '--n_layer', 'expected --key=value'),
    ('train.py', '--task=copy --task_min_len=0', 'task_min_len must be >= 1'),
    ('train.py', '--task=copy --task_min_len=50 --task_max_len=10', 'is above task_max_len'),
    ('train.py', '--task=needle --needle_keys=0', 'needle_keys must be >= 1'),
    ('train.py', '--task=copy --task_eval_samples=0', 'task_eval_samples must be >= 1'),
    # train.py: the machine
    ('train.py', '--device=cuda', "torch sees 0 GPU(s) here"),
    ('train.py', '--device=cuda:3', "torch sees 0 GPU(s) here"),
    ('train.py', '--device=tpu', "device must be 'auto', 'cpu'"),
    ('train.py', '--device=mps', 'this machine has no MPS'),
    # train.py: files read
    ('train.py', '{bad}/syntax.py', 'syntax.py, line 2: invalid syntax'),
    ('train.py', '{bad}/name.py', 'name.py stops with NameError'),
    ('train.py', '{bad}/absent.py', 'cannot read config file'),
    ('train.py', '--data_dir={bad}/meta_empty', 'is not the meta.json of a prepared dataset'),
    ('train.py', '--data_dir={bad}/meta_list', 'is not the meta.json of a prepared dataset'),
    ('train.py', '--data_dir={bad}/meta_nofield', 'is not the meta.json of a prepared dataset'),
    ('train.py', '--data_dir={bad}/shard_text', 'is not a token shard'),
    ('train.py', '--data_dir={bad}/shard_cut', 'is cut short or damaged'),
    ('train.py', '--data_dir={bad}/absent', 'no train data in'),
    ('train.py', '--init_from=/nonexistent/ckpt.pt', 'init_from must be'),
    ('train.py', '--init_from={bad}/noargs.pt', 'not a model checkpoint of this repository'),
    ('train.py', '--init_from={bad}/notok.pt', 'not a model checkpoint of this repository'),
    ('train.py', '--init_from={bad}/text.pt', 'is not a checkpoint written by torch.save'),
    ('train.py', '--init_from={bad}/payload.pt', 'is not a checkpoint written by torch.save'),
    ('train.py', '--init_from={bad}/optim.pt', 'is an optimizer state'),
    ('train.py', '--init_from={bad}/cfg_list', 'is not a model config'),
    ('train.py', '--init_from={bad}/cfg_nofields', 'lacks'),
    ('train.py', '--init_from={bad}/cfg_notjson', 'is not JSON'),
    ('train.py', '--init_from={bad}/mamba_payload', 'cannot be read as tensors'),
    ('train.py', '--init_from={ckpt} --n_embd=64', 'continued pre-training takes the architecture'),
    ('train.py', '--init_from={ckpt} --model_type=mamba2', 'but the config sets model_type'),
    ('train.py', '--init_from=resume', 'holds no checkpoint yet: start the run again'),
    ('train.py', '--out_dir={bad}/started --init_from=resume', 'without --init_from=resume'),
    ('train.py', '--init_from={bad}/saved_payload.pt', 'holds objects other than tensors'),
    # train.py: the run folder
    ('train.py', '--out_dir=/proc/x', 'cannot write to out_dir /proc/x'),
    ('train.py', '--out_dir={bad}/afile', 'cannot write to out_dir'),
    ('train.py', '--out_dir={bad}/afile/run', 'cannot write to out_dir'),
    ('train.py', '--out_dir={run}', 'already holds checkpoints of an earlier run'),
    ('train.py', '--out_dir={run} --init_from=resume --n_embd=64', 'describes another model'),
    ('train.py', '--out_dir={run} --init_from=resume --halt_at=4', 'halt_at = 4, but the run'),
    # eval_niah.py
    ('eval_niah.py', '--lengths=[]', 'lengths must not be empty'),
    ('eval_niah.py', '--lengths=[1024.5]', 'lengths must be list[int]'),
    ('eval_niah.py', '--lengths=[0]', 'each of lengths must be >= 1'),
    ('eval_niah.py', '--lengths=[-1024]', 'each of lengths must be >= 1'),
    ('eval_niah.py', '--lengths=1024', 'lengths must be list[int]'),
    ('eval_niah.py', '--samples=0', 'samples must be >= 1'),
    ('eval_niah.py', '--samples=-1', 'samples must be >= 1'),
    ('eval_niah.py', '--depths=[150]', 'each of depths must be >= 0 and <= 100'),
    ('eval_niah.py', '--depths=[-5]', 'each of depths must be >= 0 and <= 100'),
    ('eval_niah.py', '--depth_samples=-1', 'depth_samples must be >= 0'),
    ('eval_niah.py', '--seed=-1', 'seed must be >= 0'),
    ('eval_niah.py', '--chunk_size=0', 'chunk_size must be >= 1'),
    ('eval_niah.py', '--chunk_size=-5', 'chunk_size must be >= 1'),
    ('eval_niah.py', '--dtype=garbage', 'dtype must be one of'),
    ('eval_niah.py', '--device=cuda', 'torch sees 0 GPU(s) here'),
    ('eval_niah.py', '--lengths=[512]', 'too few for this task'),
    ('eval_niah.py', '--window=-1', 'window must be >= 0'),
    ('eval_niah.py', "--overrides={'foo': 1}", "with overrides {'foo': 1}"),
    ('eval_niah.py', "--overrides={'vpad_variant': 'Z'}", "unknown vpad_variant 'Z'"),
    ('eval_niah.py', '--ckpt=', 'give a checkpoint'),
    ('eval_niah.py', '--ckpt=/nonexistent.pt', 'cannot load /nonexistent.pt'),
    ('eval_niah.py', '--ckpt={bad}/noargs.pt', 'not a model checkpoint of this repository'),
    ('eval_niah.py', '--ckpt={bad}/notok.pt', 'not a model checkpoint of this repository'),
    ('eval_niah.py', '--ckpt={bad}/text.pt', 'is not a checkpoint written by torch.save'),
    ('eval_niah.py', '--ckpt={bad}/payload.pt', 'is not a checkpoint written by torch.save'),
    ('eval_niah.py', '--ckpt={bad}/optim.pt', 'is an optimizer state'),
    ('eval_niah.py', '--ckpt={bad}/cfg_list', 'is not a model config'),
    ('eval_niah.py', '--ckpt={bad}/cfg_nofields', 'lacks'),
    ('eval_niah.py', '--ckpt={bad}/mamba_payload', 'cannot be read as tensors'),
    ('eval_niah.py', '--out={bad}/results', 'is not a results file with settings'),
    ('eval_niah.py', '--out={bad}/rows', 'line 2 of'),
    ('eval_niah.py', '--out={bad}/summary', 'was not written by eval_niah.py'),
    ('eval_niah.py', '--out=/proc/x/r', 'cannot write /proc/x/r.json'),
    ('eval_niah.py', '--out={bad}/afile/r', 'is not a writable folder'),
    ('eval_niah.py', '--out={run}/log', "is a training run's file or folder"),
    ('eval_niah.py', '--out={bad}/', 'names a folder, but eval_niah.py takes a prefix'),
    ('eval_niah.py', '--ckpt={bad}/saved_payload.pt',
     'than tensors and plain data (posix.system): not loaded'),
    # eval_ruler.py
    ('eval_ruler.py', '--lengths=[]', 'lengths must not be empty'),
    ('eval_ruler.py', '--lengths=[1024.5]', 'lengths must be list[int]'),
    ('eval_ruler.py', '--lengths=[-1]', 'each of lengths must be >= 1'),
    ('eval_ruler.py', '--samples=0', 'samples must be >= 1'),
    ('eval_ruler.py', '--seed=-1', 'seed must be >= 0'),
    ('eval_ruler.py', '--chunk_size=0', 'chunk_size must be >= 1'),
    ('eval_ruler.py', '--dtype=fp8', 'dtype must be one of'),
    ('eval_ruler.py', '--device=cuda', 'torch sees 0 GPU(s) here'),
    ('eval_ruler.py', '--tasks=[]', 'tasks must not be empty'),
    ('eval_ruler.py', '--tasks=niah_single_7', "unknown RULER task 'niah_single_7'"),
    ('eval_ruler.py', '--tasks=[1, 2]', "unknown RULER task 1"),
    ('eval_ruler.py', '--ckpt=', 'give a checkpoint'),
    ('eval_ruler.py', '--ckpt={bad}/noargs.pt', 'not a model checkpoint of this repository'),
    ('eval_ruler.py', '--ckpt={bad}/mamba_payload', 'cannot be read as tensors'),
    ('eval_ruler.py', "--tasks=['qa_1'] --squad={bad}/absent.json", "absent.json is not squad's"),
    ('eval_ruler.py', "--tasks=['qa_1'] --squad={bad}/empty.json", "is not squad's dev JSON"),
    ('eval_ruler.py', "--tasks=['qa_1'] --squad={bad}/list.json", "is not squad's dev JSON"),
    ('eval_ruler.py', "--tasks=['qa_2'] --hotpotqa={bad}/empty.json", "is not hotpotqa's dev JSON"),
    ('eval_ruler.py', '--out={bad}/results', 'is not a results file with settings'),
    ('eval_ruler.py', '--out={bad}/afile/r', 'is not a writable folder'),
    ('eval_ruler.py', '--out={run}/log', "is a training run's file or folder"),
    ('eval_ruler.py', '--out={run}/', 'names a folder'),
    ('eval_ruler.py', "--ckpt=['{ckpt}', '{ckpt}'] --table={run}/.", 'names a folder'),
    ('eval_ruler.py', '--essay={bad}/absent.json', 'absent.json is not a file'),
    # tools/eval_helmet.py
    ('tools/eval_helmet.py', '--lengths=[]', 'lengths must not be empty'),
    ('tools/eval_helmet.py', '--lengths=[8192.5]', 'lengths must be list[int]'),
    ('tools/eval_helmet.py', '--samples=0', 'samples must be >= 1'),
    ('tools/eval_helmet.py', '--seed=-1', 'seed must be >= 0'),
    ('tools/eval_helmet.py', '--chunk_size=-5', 'chunk_size must be >= 1'),
    ('tools/eval_helmet.py', '--dtype=x', 'dtype must be one of'),
    ('tools/eval_helmet.py', '--tasks=[]', 'tasks must not be empty'),
    ('tools/eval_helmet.py', '--tasks=foo', "unknown HELMET recall task 'foo'"),
    ('tools/eval_helmet.py', '--ckpt=', 'give a checkpoint'),
    ('tools/eval_helmet.py', '--ckpt={bad}/cfg_list', 'is not a model config'),
    ('tools/eval_helmet.py', '--out={bad}/results', 'is not a results file with settings'),
    ('tools/eval_helmet.py', '--out=/proc/x/r', 'cannot write /proc/x/r.json'),
    ('tools/eval_helmet.py', '--essay={bad}', 'is not a file: give RULER'),
    # eval_loss.py
    ('eval_loss.py', '--train_length=-1', 'train_length must be >= 1'),
    ('eval_loss.py', '--smooth=0', 'smooth must be >= 1'),
    ('eval_loss.py', '--smooth=-4', 'smooth must be >= 1'),
    ('eval_loss.py', '--docs=-1', 'docs must be >= 1'),
    ('eval_loss.py', '--docs=0', 'docs must be >= 1'),
    ('eval_loss.py', '--max_length=-5', 'max_length must be >= 1'),
    ('eval_loss.py', '--windows_per_doc=0', 'windows_per_doc must be >= 1'),
    ('eval_loss.py', '--chunk_size=0', 'chunk_size must be >= 1'),
    ('eval_loss.py', '--dtype=half', 'dtype must be one of'),
    ('eval_loss.py', '--device=cuda', 'torch sees 0 GPU(s) here'),
    ('eval_loss.py', '--max_length=100000', 'no document in'),
    ('eval_loss.py', '--data_dir={bad}/meta_empty', 'is not the meta.json of a prepared dataset'),
    ('eval_loss.py', '--data_dir={bad}/shard_cut', 'is cut short or damaged'),
    ('eval_loss.py', '--data_dir={bad}/shard_text_val', 'is not a token shard'),
    ('eval_loss.py', '--data_dir={bad}/absent', 'no val data in'),
    ('eval_loss.py', '--ckpt=[]', 'give a checkpoint'),
    ('eval_loss.py', '--ckpt={bad}/text.pt', 'is not a checkpoint written by torch.save'),
    ('eval_loss.py', '--ckpt={bad}/notok.pt', 'not a model checkpoint of this repository'),
    ('eval_loss.py', '--out={bad}/afile/x', 'is not a writable folder'),
    ('eval_loss.py', '--out={bad}/summary', 'was not written by eval_loss.py'),
    ('eval_loss.py', '--out=/proc/x/l', 'cannot write /proc/x/l.json'),
    ('eval_loss.py', '--out=.', 'names a folder'),
    # average_ckpts.py
    ('average_ckpts.py', '--last=-3', 'last must be >= 0'),
    ('average_ckpts.py', '--stride=0', 'stride must be >= 1'),
    ('average_ckpts.py', '--start=-1', 'start must be >= 0'),
    ('average_ckpts.py', '--stop=-5', 'stop must be >= 0 (or -1)'),
    ('average_ckpts.py', '--steps=[-1]', 'each of steps must be >= 0'),
    ('average_ckpts.py', '--steps=[1.5]', 'steps must be list[int]'),
    ('average_ckpts.py', '--ckpt_dir=', 'give --ckpt_dir'),
    ('average_ckpts.py', '--steps=[5]', 'no such checkpoints'),
    ('average_ckpts.py', '--last=5', 'fewer than the 5 asked for'),
    ('average_ckpts.py', '--ckpt_dir={bad}/absent', 'is not a folder'),
    ('average_ckpts.py', '--ckpt_dir={bad}', 'fewer than the 2 asked for'),
    ('average_ckpts.py', "--ckpts=['{ckpt}', '{bad}/cfg_list']", 'cannot average checkpoint files'),
    ('average_ckpts.py', "--ckpts=['{bad}/noargs.pt', '{ckpt}']", 'not a model checkpoint of this'),
    ('average_ckpts.py', "--ckpts=['{bad}/text.pt', '{ckpt}']", 'is not a checkpoint written by'),
    ('average_ckpts.py', '--out={run}/ckpt_000004.pt', "is a training run's file or folder"),
    ('average_ckpts.py', '--out={run}/optim_000008.pt', "is a training run's file or folder"),
    ('average_ckpts.py', '--out={run}/log.jsonl', "is a training run's file or folder"),
    ('average_ckpts.py', '--out={bad}/afile', 'was not written by average_ckpts.py'),
    ('average_ckpts.py', '--out={bad}', "was not written by average_ckpts.py"),
    ('average_ckpts.py', '--out=/proc/x/avg.pt', 'cannot write /proc/x/avg.pt'),
    ('average_ckpts.py', "--ckpts=['{bad}/cfg_list', '{bad}/mamba_payload']",
     'cfg_list/config.json is not a model config'),
    ('average_ckpts.py', "--ckpts=['{bad}/text.pt', '{ckpt}'] --out={bad}/text.pt",
     'is an input of average_ckpts.py'),
    # tools/export_hf.py
    ('tools/export_hf.py', '--ckpt=', 'give --ckpt=<checkpoint file> and --out=<folder>'),
    ('tools/export_hf.py', '--out=', 'give --ckpt=<checkpoint file> and --out=<folder>'),
    ('tools/export_hf.py', '--dtype=int8', 'dtype must be one of'),
    ('tools/export_hf.py', '--out={run}', "is a training run's file or folder"),
    ('tools/export_hf.py', '--out={bad}/afile', 'was not written by tools/export_hf.py'),
    ('tools/export_hf.py', '--out={bad}', 'was not written by tools/export_hf.py'),
    ('tools/export_hf.py', '--out=/proc/x/e', 'cannot write /proc/x/e'),
    ('tools/export_hf.py', '--ckpt=/nonexistent.pt', 'cannot load /nonexistent.pt'),
    ('tools/export_hf.py', '--ckpt={bad}/text.pt', 'is not a checkpoint written by torch.save'),
    ('tools/export_hf.py', '--ckpt={bad}/noargs.pt', 'not a model checkpoint of this repository'),
    ('tools/export_hf.py', '--ckpt={bad}/optim.pt', 'is an optimizer state'),
    ('tools/export_hf.py', '', "SmolLM3's layout needs"),
    ('tools/export_hf.py', '--source={bad}/absent', 'absent is not a folder'),
    # tools/tables.py
    ('tools/tables.py', '--table=2', 'give --table= one of 1, 5, 6'),
    ('tools/tables.py', '--table=figure2', 'give --table= one of 1, 5, 6'),
    ('tools/tables.py', '--samples=-1', 'samples must be >= 0'),
    ('tools/tables.py', '--ks=[0]', 'each of ks must be >= 1'),
    ('tools/tables.py', '--ks=[]', 'ks must not be empty'),
    ('tools/tables.py', '--lengths=[512.5]', 'lengths must be list[int]'),
    ('tools/tables.py', '--points=0', 'points must be >= 1'),
    ('tools/tables.py', '--out=', 'give --out=<folder>'),
    ('tools/tables.py', '--out={bad}/afile', 'exists and was not written by tools/tables.py'),
    ('tools/tables.py', '--runs={tmp}/none', 'holds no checkpoint: train it'),
    ('tools/tables.py', '--table=12 --weights={tmp}/none', 'put the released weights'),
    # tools/probe_variance.py
    ('tools/probe_variance.py', '--dropout=1.0', 'dropout must be below 1'),
    ('tools/probe_variance.py', '--length=-5', 'length >= 0'),
    ('tools/probe_variance.py', '--batch_size=0', 'batch_size >= 1'),
    ('tools/probe_variance.py', '--ckpt=', 'give a checkpoint'),
    ('tools/probe_variance.py', '--ckpt=/nonexistent.pt', 'cannot load /nonexistent.pt'),
    ('tools/probe_variance.py', '', 'give --dropout_type=pre_linear or vpad'),
    ('tools/probe_variance.py', '--device=cuda', 'torch sees 0 GPU(s) here'),
    ('tools/probe_variance.py', '--dropout_type=vpad --vpad_variant=Z', "unknown vpad_variant 'Z'"),
    ('tools/probe_variance.py', '--dropout_type=vpad --length=100000000',
     'too few for windows of 100000001: give a shorter --length'),
    ('tools/probe_variance.py', '--dropout_type=vpad --out=/proc/x/p',
     'cannot write /proc/x/p.json'),
    ('tools/probe_variance.py', '--dropout_type=vpad --out={bad}/summary', 'was not written by'),
    # tools/eval_lm.py: its output is checked before lm-eval runs
    ('tools/eval_lm.py', '--out={run}/ckpt_000004.pt', "is a training run's file or folder"),
    ('tools/eval_lm.py', '--out={run}', "is a training run's file or folder"),
    ('tools/eval_lm.py', '--ckpt={bad}/text.pt --out={bad}/text.pt', 'is an input of'),
    ('tools/eval_lm.py', '--out={bad}/afile', 'was not written by tools/eval_lm.py'),
    ('tools/eval_lm.py', '--out=/proc/x/l.json', 'cannot write /proc/x/l.json'),
    # the tools that write a folder of results, and a dataset's preparation
    ('tools/gpu_check.py', '--out={run}', "is a training run's file or folder"),
    ('tools/gpu_check.py', '--out={bad}/afile', 'was not written by tools/gpu_check.py'),
    ('tools/gpu_check.py', '--out={bad}/checks', 'results.json exists and was not written'),
    ('tools/study.py', '--out={run}', "is a training run's file or folder"),
    ('tools/study.py', '--out={bad}/afile/x', 'is not a writable folder'),
    ('data/shakespeare/prepare.py', '--out_dir={run}', "is a training run's file or folder"),
    ('data/shakespeare/prepare.py', '--out_dir={bad}/afile', 'was not written by prepare.py'),
]

# what each script is given besides the bad input: a command line that would run
SHORT = ('--ckpt={ckpt}', '--lengths=[1024]', '--samples=1')
BASE = {'train.py': TRAIN, 'eval_niah.py': (*SHORT, '--depths=[]'),
        'eval_ruler.py': (*SHORT, "--tasks=['niah_single_1']"),
        'tools/eval_helmet.py': (*SHORT, "--tasks=['json_kv']"),
        'eval_loss.py': ('--ckpt={ckpt}', '--max_length=64'),
        'average_ckpts.py': ('--ckpt_dir={run}', '--last=2', '--out={tmp}/avg.pt'),
        'tools/export_hf.py': ('--ckpt={ckpt}', '--out={tmp}/export'),
        'tools/probe_variance.py': ('--ckpt={ckpt}',),
        'tools/eval_lm.py': ('--ckpt={ckpt}', '--tasks=arc_easy'),
        # --parts=['nope']: the study refuses it, should its output's guard let it through
        'tools/gpu_check.py': (), 'tools/study.py': ("--parts=['nope']",),
        'data/shakespeare/prepare.py': (), 'tools/tables.py': ('--table=11', '--out={tmp}/t')}


def bad_files(d, data):
    """The unreadable and the misleading inputs, in folder d (a pathlib.Path); data: a good
    dataset."""
    d.mkdir()
    (d / 'syntax.py').write_text("n_layer = 2\nn_head = = 4\n")
    (d / 'name.py').write_text("n_layer = two\n")
    (d / 'afile').write_text("a file of the user's\n")
    metas = (('meta_empty', ''), ('meta_list', '[]'),
             ('meta_nofield', '{"tokenizer": {"kind": "byte"}}'))
    for name, meta in metas:
        shutil.copytree(data, d / name)
        (d / name / 'meta.json').write_text(meta)
    shutil.copytree(data, d / 'shard_text')
    (d / 'shard_text' / 'train.bin').write_text("just some text, not tokens\n" * 20)
    shutil.copytree(data, d / 'shard_text_val')
    (d / 'shard_text_val' / 'val.bin').write_text("just some text, not tokens\n" * 20)
    shutil.copytree(data, d / 'shard_cut')
    for split in ('train', 'val'):
        raw = (d / 'shard_cut' / f'{split}.bin').read_bytes()
        (d / 'shard_cut' / f'{split}.bin').write_bytes(raw[:len(raw) // 2])
    return d


class Payload:
    def __reduce__(self):  # what a malicious pickle runs on loading, if it is loaded unsafely
        return (os.system, (f'touch {ROOT}/PWNED',))


@pytest.fixture(scope='module')
def world(tiny_data, tiny_run, tmp_path_factory):
    """{data, run, ckpt, bad}: the good inputs and the bad ones."""
    bad = bad_files(tmp_path_factory.mktemp('inputs') / 'bad', tiny_data)
    ckpt = checkpoint.step_path(tiny_run, 8)
    good = dict(checkpoint.load(ckpt))
    for name, drop in (('noargs', 'model_args'), ('notok', 'tokenizer')):
        checkpoint.save({k: v for k, v in good.items() if k != drop}, str(bad / f'{name}.pt'))
    checkpoint.save({'optimizer': {}, 'step': 8}, str(bad / 'optim.pt'))
    (bad / 'text.pt').write_text("not a checkpoint\n")
    (bad / 'payload.pt').write_bytes(pickle.dumps(Payload()))
    torch.save({**good, 'payload': Payload()}, bad / 'saved_payload.pt')  # a zip, as torch writes
    configs = (('cfg_list', '[]'), ('cfg_nofields', '{"model_type": "smollm3"}'),
               ('cfg_notjson', '{'))
    for name, config in configs:
        (bad / name).mkdir()
        (bad / name / 'config.json').write_text(config)
    (bad / 'mamba_payload').mkdir()
    (bad / 'mamba_payload' / 'config.json').write_text(json.dumps(
        {'d_model': 32, 'n_layer': 1, 'vocab_size': 32,
         'ssm_cfg': {'layer': 'Mamba2', 'd_state': 8, 'headdim': 16}}))
    mamba = Mamba2(Mamba2Config(vocab_size=32, n_layer=1, n_embd=32, d_state=8, headdim=16))
    torch.save({'weights': mamba.state_dict(), 'payload': Payload()},
               bad / 'mamba_payload' / 'pytorch_model.bin')
    (bad / 'results.jsonl').write_text('{"event": "start", "iter": 0}\n')  # another tool's lines
    settings = {'settings': {}}
    (bad / 'rows.jsonl').write_text(json.dumps(settings) + '\n{"no id": 1}\n{"id": "x"}\n')
    (bad / 'summary.json').write_text('{"mine": true}\n')  # a user's file, where a summary goes
    (bad / 'started').mkdir()  # a run killed before its first checkpoint: its start record
    (bad / 'started' / 'log.jsonl').write_text('{"event": "start", "iter": 0, "session": 0}\n')
    (bad / 'checks').mkdir()
    (bad / 'checks' / 'results.json').write_text('{"mine": true}\n')  # and where a self-check's
    (bad / 'empty.json').write_text('')
    (bad / 'list.json').write_text('[]')
    return {'data': tiny_data, 'run': tiny_run, 'ckpt': ckpt, 'bad': str(bad)}


def files(*folders):
    """path -> (size, mtime) of every file under the folders; a run's lock is rewritten by
    design."""
    found = {}
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                if name != 'lock':
                    st = os.stat(os.path.join(root, name))
                    found[os.path.join(root, name)] = (st.st_size, st.st_mtime_ns)
    return found


def test_the_table_has_every_script_and_enough_cases():
    assert {script for script, *_ in CASES} == set(BASE) and len(CASES) >= 150
    assert len({(script, args) for script, args, _ in CASES}) == len(CASES)


def refused(world, tmp_path, script, args, message=''):
    """Run script with BASE[script] and args ({data}, {run}, ... filled in; the later of a key
    wins) -> what it said, having checked that it was refused in one line that holds message, and
    that no file changed under the test's folders or at the repository's root."""
    places = {**world, 'tmp': str(tmp_path)}

    def fill(text):  # {data}, {run}, ... -> their paths (not str.format: the values hold braces)
        for key, value in places.items():
            text = text.replace('{' + key + '}', value)
        return text
    argv = [fill(a) for a in (*BASE[script], *re.split(r' (?=--)', args)) if a]  # the later wins
    watched = (world['data'], world['run'], world['bad'], str(tmp_path))
    before, root = files(*watched), sorted(os.listdir(ROOT))
    code, said = run_script(script, *argv)
    assert code == 1 and fill(message) in said, said
    assert '\n' not in said.strip() and 'Traceback' not in said
    assert files(*watched) == before and sorted(os.listdir(ROOT)) == root
    assert not os.path.exists(os.path.join(ROOT, 'PWNED'))
    return said


@pytest.mark.parametrize('script,args,message', CASES, ids=[f'{s}:{a}' for s, a, _ in CASES])
def test_a_bad_input_is_one_line_and_leaves_everything_as_it_was(world, tmp_path, script, args,
                                                                 message):
    refused(world, tmp_path, script, args, message)


# Every writer's output aimed at a tiny run's files, at the run's folder and at its own input:
# refused, nothing changed. A writer of <prefix>.json and more is aimed at each run file that
# ends in a suffix of its (log.jsonl), and at the folder as 'run/'.
PREFIXES = {'eval_niah.py': ('.json', '.jsonl', '.png'), 'eval_ruler.py': ('.json', '.jsonl'),
            'tools/eval_helmet.py': ('.json', '.jsonl'), 'eval_loss.py': ('.json', '.png'),
            'tools/probe_variance.py': ('.json', '.png')}
WRITERS = {**dict.fromkeys(PREFIXES, '--out'), 'average_ckpts.py': '--out',
           'tools/export_hf.py': '--out', 'tools/eval_lm.py': '--out',
           'tools/gpu_check.py': '--out', 'tools/study.py': '--out',
           'data/shakespeare/prepare.py': '--out_dir', 'train.py': '--out_dir',
           'tools/tables.py': '--out'}
RUN_FILES = ['ckpt_000004.pt', 'ckpt_000008.pt', 'optim_000008.pt', 'log.jsonl', 'lock']
REFUSALS = ("is a training run's file or folder", 'is an input of', 'names a folder',
            'cannot write to out_dir', 'already holds checkpoints of an earlier run')


def aims(script):
    if script in PREFIXES:
        return [f'{{run}}/{f.removesuffix(x)}' for f in RUN_FILES for x in PREFIXES[script]
                if f.endswith(x)] + ['{run}/']
    return [f'{{run}}/{f}' for f in RUN_FILES] + ['{run}', '{ckpt}']


WALK = [(s, f'{WRITERS[s]}={a}' + (' --dropout_type=vpad' if 'probe' in s else ''))
        for s in WRITERS for a in aims(s)]


def test_the_walk_has_every_writer():
    assert set(WRITERS) == set(BASE) and len(WALK) >= 50


@pytest.mark.parametrize('script,args', WALK, ids=[f'{s}:{a}' for s, a in WALK])
def test_no_writer_writes_over_a_run_or_its_input(world, tmp_path, script, args):
    said = refused(world, tmp_path, script, args)
    assert any(r in said for r in REFUSALS), said
