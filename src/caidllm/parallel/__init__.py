"""Tensor and expert parallelism (``--tp N``): one model divided among N ranks of a
torch.distributed group (gloo on CPU, nccl on CUDA), rank 0 driving the engine.

mesh.py (the group, its collectives and their time), sharding.py (dividing a loaded model),
mirror.py (rank 0's engine inputs broadcast, the other ranks following), launch.py (spawning
the ranks of a command)."""
