#!/bin/bash
# A multi-node torchrun launch as it is written for Slurm: one torchrun per node, meeting at the first node.
#SBATCH --job-name=ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=2
#SBATCH --mem=4G
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out

set -euo pipefail

nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )
head_node=${nodes[0]}
# A multi-homed host lists several addresses: the first is the one its name resolves to first.
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
echo "head node: $head_node ($head_node_ip), nodes: ${nodes[*]}"

# A port per job, so that two jobs sharing a head node do not collide.
port=$((20000 + SLURM_JOB_ID % 20000))
export OMP_NUM_THREADS=1
export LOGLEVEL=WARNING

srun torchrun \
    --nnodes "$SLURM_NNODES" \
    --nproc_per_node 2 \
    --rdzv_id "$SLURM_JOB_ID" \
    --rdzv_backend c10d \
    --rdzv_endpoint "$head_node_ip:$port" \
    train.py
