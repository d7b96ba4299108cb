"""Energy and memory meters: RAPL counters (wraparound included) and NVML
(energy counter, or sampled power) read through fakes, and "not measurable"
reported as None, never as a made-up figure."""

import sys
import time
import types

import pytest
import torch

from caidllm.bench import measure


def _rapl(root, package, energy_uj, max_uj=1_000_000):
    d = root / f"intel-rapl:{package}"
    d.mkdir(exist_ok=True)
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_rapl_sums_packages_and_handles_wraparound(tmp_path):
    p0, p1 = _rapl(tmp_path, 0, 900_000), _rapl(tmp_path, 1, 100)
    sub = tmp_path / "intel-rapl:0:0"  # a sub-domain: inside the package figure, not added again
    sub.mkdir()
    (sub / "energy_uj").write_text("5\n")
    meter = measure.RaplMeter(tmp_path)
    assert [p.name for p in meter.packages] == ["intel-rapl:0", "intel-rapl:1"]
    meter.start()
    (p0 / "energy_uj").write_text("100000\n")  # wrapped: 900000 -> 1000000 -> 100000 = 200000 uJ
    (p1 / "energy_uj").write_text("300100\n")  # 300000 uJ
    reading = meter.stop()
    assert reading.joules == pytest.approx(0.5) and reading.source == "rapl-package"


def test_no_rapl_means_no_energy(tmp_path):
    meter = measure.EnergyMeter(torch.device("cpu"))
    meter.meter = measure.RaplMeter(tmp_path)  # an empty powercap folder
    meter.start()
    reading = meter.stop()
    assert reading.joules is None and reading.source is None


class _FakeNvml(types.ModuleType):
    def __init__(self, counter=True):
        super().__init__("pynvml")
        self.counter, self.energy_mj, self.t0 = counter, 1_000_000, time.perf_counter()

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return "gpu0"

    def nvmlDeviceGetHandleByIndex(self, index):
        return "gpu0"

    def nvmlDeviceGetPowerUsage(self, handle):
        return 200_000  # mW = 200 W

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.counter:
            raise RuntimeError("not supported")
        # 200 W since creation
        return int(self.energy_mj + 200_000 * (time.perf_counter() - self.t0))


@pytest.mark.parametrize("counter", [True, False])
def test_nvml_energy_counter_or_sampled_power(monkeypatch, counter):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(counter))
    meter = measure.NvmlMeter(torch.device("cuda:0"))
    assert meter.available
    meter.start()
    time.sleep(0.3)
    reading = meter.stop()
    assert reading.source == ("nvml-energy-counter" if counter else "nvml-power-sampling")
    assert reading.avg_power_w == pytest.approx(200, rel=0.05)
    assert reading.joules == pytest.approx(200 * 0.3, rel=0.35)


def test_nvml_missing_means_no_energy(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    meter = measure.NvmlMeter(torch.device("cuda:0"))
    assert not meter.available and "pynvml" in meter.note


def test_cpu_memory_is_the_process_peak():
    meter = measure.MemoryMeter(torch.device("cpu"))
    meter.reset()
    assert meter.kind == "process_peak_rss" and meter.peak_mb() > 10
