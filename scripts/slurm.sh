#!/bin/bash
# Multi-node training under SLURM: one torchrun per node (srun), a c10d rendezvous on the first
# node, every GPU of every node a process (DDP, or FSDP2 with --parallel=fsdp). The global batch
# (tokens_per_batch) is the config's at any node count: train.py divides it over the processes.
#
#   sbatch --nodes=4 --gres=gpu:8 scripts/slurm.sh configs/vpad.py
#   sbatch --nodes=2 --gres=gpu:8 scripts/slurm.sh configs/smollm3_pl_d.py --parallel=fsdp
#
#SBATCH --job-name=lengthgen
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
gpus_per_node=${GPUS_PER_NODE:-$(nvidia-smi --list-gpus | wc -l)}
srun torchrun --nnodes="$SLURM_NNODES" --nproc_per_node="$gpus_per_node" \
    --rdzv_backend=c10d --rdzv_endpoint="$head_node:${MASTER_PORT:-29500}" \
    --rdzv_id="$SLURM_JOB_ID" \
    train.py "$@"
