"""Peak memory and energy around one method's run.

Memory: on a CUDA device, ``torch.cuda.max_memory_allocated`` after a reset
of the peak counter before each method (tensors allocated by PyTorch on that
device). On CPU, the peak resident set size of the whole process
(``getrusage``), which only ever grows: it is the process peak so far, not a
per-method figure.

Energy: on CUDA, NVML (``pynvml``, optional): the board's total-energy
counter read before and after when the GPU has one, and the power draw
sampled every 50 ms in a background thread and integrated (trapezoids); the
counter is preferred. On CPU, RAPL package energy from
/sys/class/powercap/intel-rapl:N/energy_uj (every package, read before and
after, counter wraparound handled) when readable; it covers the whole CPU
package, every process on it included. Otherwise energy is None ("n/a"):
never an estimate.
"""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

RAPL_ROOT = Path("/sys/class/powercap")


@dataclass
class EnergyReading:
    joules: float | None
    avg_power_w: float | None
    source: str | None  # "nvml-energy-counter" | "nvml-power-sampling" | "rapl-package" | None
    note: str = ""


class MemoryMeter:
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.kind = "cuda_max_memory_allocated" if self.cuda else "process_peak_rss"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mb(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rapl_packages(root: Path = RAPL_ROOT) -> list[Path]:
    """Top-level RAPL domains (intel-rapl:0, intel-rapl:1, ...) whose counter is readable."""
    found = []
    for domain in sorted(root.glob("intel-rapl:*")):
        if domain.name.count(":") != 1:
            continue  # sub-domains (core, uncore, dram) are inside the package figure
        try:
            int((domain / "energy_uj").read_text())
            found.append(domain)
        except (OSError, ValueError):
            continue
    return found


class RaplMeter:
    def __init__(self, root: Path = RAPL_ROOT):
        self.packages = _rapl_packages(root)
        self._start: list[int] = []
        self._t0 = 0.0

    @property
    def available(self) -> bool:
        return bool(self.packages)

    def _read(self) -> list[int]:
        return [int((p / "energy_uj").read_text()) for p in self.packages]

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._start = self._read()

    def stop(self) -> EnergyReading:
        end = self._read()
        elapsed = time.perf_counter() - self._t0
        total_uj = 0
        for package, before, after in zip(self.packages, self._start, end):
            if after < before:  # the counter wrapped around
                try:
                    span = int((package / "max_energy_range_uj").read_text())
                except (OSError, ValueError):
                    return EnergyReading(None, None, None, "RAPL counter wrapped and its range is unreadable")
                after += span
            total_uj += after - before
        joules = total_uj / 1e6
        return EnergyReading(
            joules,
            joules / elapsed if elapsed > 0 else None,
            "rapl-package",
            "CPU package energy (all processes on the package)",
        )


class NvmlMeter:
    """GPU energy of one CUDA device via NVML (pynvml)."""

    PERIOD_S = 0.05

    def __init__(self, device: torch.device):
        self.handle = None
        self.note = ""
        try:
            import pynvml
        except ImportError:
            self.note = "pynvml not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self.handle = _nvml_handle(pynvml, torch.device(device))
        except Exception as e:  # noqa: BLE001 - NVML raises its own error types
            self.note = f"NVML unavailable: {e}"
            self.handle = None
        self.nvml = pynvml
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counter0: int | None = None

    @property
    def available(self) -> bool:
        return self.handle is not None

    def _power_w(self) -> float:
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def _counter_mj(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # noqa: BLE001 - not supported on every GPU
            return None

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._samples.append((time.perf_counter(), self._power_w()))
            except Exception:  # noqa: BLE001
                pass
            self._stop.wait(self.PERIOD_S)

    def start(self) -> None:
        self._samples = []
        self._stop.clear()
        self._counter0 = self._counter_mj()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._sample_loop, name="caidllm-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> EnergyReading:
        t1 = time.perf_counter()
        counter1 = self._counter_mj()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        elapsed = t1 - self._t0
        if self._counter0 is not None and counter1 is not None and counter1 >= self._counter0:
            joules = (counter1 - self._counter0) / 1000.0
            return EnergyReading(
                joules,
                joules / elapsed if elapsed > 0 else None,
                "nvml-energy-counter",
                "GPU board energy only",
            )
        samples = [(t, p) for t, p in self._samples if t <= t1]
        if len(samples) < 2:
            return EnergyReading(
                None, None, None, "too few NVML power samples (run shorter than the 50 ms period)"
            )
        joules = sum((t2 - ta) * (pa + p2) / 2 for (ta, pa), (t2, p2) in zip(samples, samples[1:]))
        span = samples[-1][0] - samples[0][0]
        avg = joules / span if span > 0 else None
        # extend to the whole run at the average power of the sampled span
        joules = avg * elapsed if avg is not None else None
        return EnergyReading(joules, avg, "nvml-power-sampling", "GPU board power only, sampled every 50 ms")


def _nvml_handle(pynvml, device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        props = torch.cuda.get_device_properties(index)
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus.encode())
    except Exception:  # noqa: BLE001 - older torch without PCI ids: assume no device remapping
        return pynvml.nvmlDeviceGetHandleByIndex(index)


class EnergyMeter:
    """NVML on CUDA devices, RAPL on CPU; `available` False when neither works."""

    def __init__(self, device: torch.device):
        device = torch.device(device)
        self.meter = NvmlMeter(device) if device.type == "cuda" else RaplMeter()
        self.note = getattr(self.meter, "note", "") or (
            "" if self.meter.available else "RAPL energy counters not readable on this machine"
        )

    @property
    def available(self) -> bool:
        return self.meter.available

    def start(self) -> None:
        if self.available:
            self.meter.start()

    def stop(self) -> EnergyReading:
        if not self.available:
            return EnergyReading(None, None, None, self.note)
        try:
            return self.meter.stop()
        except Exception as e:  # noqa: BLE001 - a meter failing must not lose the run
            return EnergyReading(None, None, None, f"energy reading failed: {e}")
