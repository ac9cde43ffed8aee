env PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 /opt/venv/bin/python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 --max-restarts=0 -m llmctl.train.entry '/runs/golden run'
