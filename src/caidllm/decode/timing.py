"""Timers for the parts of an engine step (the commit policy, the model forwards)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class DeviceTimer:
    """Time spent in a part of the step (the commit policy, the model forwards). On CUDA,
    events around each call are read at the end, so the timing adds no host sync to the step
    (events already passed, as they are after the step's transfer, are read without one)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.seconds = 0.0
        self.events: list = []

    def __enter__(self):
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._tick = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.seconds += time.perf_counter() - self._tick

    @contextmanager
    def paused(self):
        """Inside a timed part, a stretch that is not its own (S2D2's verify forward, run from inside its
        commit policy, is forward time)."""
        self.__exit__()
        try:
            yield
        finally:
            self.__enter__()

    def total(self) -> float:
        if self.cuda:
            if not all(end.query() for _, end in self.events):
                torch.cuda.synchronize()
            self.seconds += sum(start.elapsed_time(end) for start, end in self.events) / 1000
            self.events.clear()
        return self.seconds
