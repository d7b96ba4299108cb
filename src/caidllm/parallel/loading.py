"""Loading a tensor-parallel rank's part of a checkpoint, never the whole model: the model is
built on the meta device (models/loading.py checks every tensor's name and shape first), divided
there (sharding.shard_modules: each sliced parameter remembers its part, ``tp_part``), and then
each parameter is read from the safetensors files at its part only (a row or column range through
safetensors' slices; a rank's experts one by one), straight onto the rank's device."""

from __future__ import annotations

import torch
from torch import nn

from .mesh import TPGroup
from .sharding import shard_modules


class ShardedLoad:
    """The `shard` reader models.load takes: called with the meta model and the checkpoint's files."""

    def __init__(self, tp: TPGroup):
        self.tp = tp

    def __call__(self, model: nn.Module, config, where: dict, names: list[str], device, dtype) -> nn.Module:
        if self.tp.size > 1:
            shard_modules(model, config, self.tp)
        names = set(names)
        with Files(where) as files:
            for module_name, module in model.named_modules():
                prefix = f"{module_name}." if module_name else ""
                for attr, tensor in list(module.named_parameters(recurse=False)):
                    value = read_part(files, prefix + attr, tensor, names).to(device=device, dtype=dtype)
                    module._parameters[attr] = nn.Parameter(value, requires_grad=False)
                for attr, tensor in list(module.named_buffers(recurse=False)):
                    if prefix + attr in where:
                        module._buffers[attr] = files.tensor(prefix + attr).to(device=device, dtype=dtype)
        return model


class Files:
    """The checkpoint's safetensors files, each opened once while a rank reads its parts."""

    def __init__(self, where: dict):
        self.where, self.open = where, {}

    def __enter__(self) -> Files:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.open.values():
            handle.__exit__(None, None, None)

    def _file(self, name: str):
        from safetensors import safe_open

        path = self.where[name]
        if path not in self.open:
            self.open[path] = safe_open(str(path), framework="pt", device="cpu").__enter__()
        return self.open[path]

    def tensor(self, name: str) -> torch.Tensor:
        return self._file(name).get_tensor(name)

    def part(self, name: str, dim: int, index) -> torch.Tensor:
        if not isinstance(index, slice):  # a gathered set of rows (LLaDA2's fused q | k | v): read, then pick
            return self.tensor(name)[index]
        view = self._file(name).get_slice(name)
        return view[index] if dim == 0 else view[:, index]


def read_part(files: Files, name: str, meta: torch.Tensor, names: set[str]) -> torch.Tensor:
    """Parameter `name`'s value on this rank: its part of the checkpoint tensor, or for stacked
    experts (``...experts.gate_proj``, per-expert tensors in the checkpoint) its experts stacked."""
    dim, index = getattr(meta, "tp_part", (0, slice(None)))
    if name in names:
        return files.part(name, dim, index)
    prefix, _, projection = name.rpartition(".")
    experts = range(meta.shape[0]) if index == slice(None) else range(index.start, index.stop)
    return torch.stack([files.tensor(f"{prefix}.{e}.{projection}.weight") for e in experts])
