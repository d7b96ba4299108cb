"""The ``native`` MoE kernel's compiled part: ``moe_native.cpp`` (shipped beside this file) built on
first use by the system's C++ compiler (``$CXX``, else ``g++``, ``c++``, ``clang++``) with
``-O3 -march=native`` into a per-user cache folder (``$CAIDLLM_NATIVE_CACHE``, else
``$XDG_CACHE_HOME/caidllm/native`` or ``~/.cache/caidllm/native``; where it cannot be written,
``caidllm-native-UID`` in the temporary folder, writable by this user alone), one file per hash of the
source, the flags, the compiler and the CPU, and loaded with ctypes: no Python headers, no ninja,
nothing to install. bf16 runs on AMX where the CPU (and Linux) offer it, else on AVX-512 BF16;
fp32 on AVX-512. Without a compiler, or on a CPU without AVX-512 (fp32) or AVX-512 BF16 (bf16),
the kernel is unavailable: ``why_unavailable`` says why, ``auto`` runs another kernel.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("moe_native.cpp")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-exceptions")
COMPILERS = ("g++", "c++", "clang++")
BUILD_SECONDS = 300  # a compiler that takes longer is taken for stuck
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
_DTYPE_BITS = {torch.float32: 1, torch.bfloat16: 2}
_log = logging.getLogger(__name__)


def cache_folder() -> Path:
    if os.environ.get("CAIDLLM_NATIVE_CACHE"):
        return Path(os.environ["CAIDLLM_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "caidllm" / "native"


def find_compiler() -> str | None:
    names = (os.environ["CXX"],) if os.environ.get("CXX") else COMPILERS
    return next((path for path in map(shutil.which, names) if path), None)


def _cpu_description() -> str:
    """The CPU's model and feature flags (for the cache key: -march=native builds for this CPU)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


def build(compiler: str) -> Path:
    """The library for this source, flags, compiler and CPU: from the cache, else compiled into it
    (written to a temporary name, then renamed: processes building at once never see half a file)."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=BUILD_SECONDS
    ).stdout
    key = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), " ".join(FLAGS), version, platform.machine(), _cpu_description()]
        ).encode()
    ).hexdigest()[:20]
    folder = cache_folder()
    library = folder / f"moe_native-{key}.so"
    if library.exists():
        return library
    if not _writable(folder):  # a read-only home, say: build where this user alone can write
        folder = _private_folder(folder)
        library = folder / library.name
        if library.exists():
            return library
    handle, partial = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(handle)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, str(SOURCE), "-o", partial],
            capture_output=True,
            text=True,
            timeout=BUILD_SECONDS,
        )
        if done.returncode:
            raise OSError(f"{Path(compiler).name} failed on {SOURCE.name}: {done.stderr.strip()[-300:]}")
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library


def _writable(folder: Path) -> bool:
    """Whether files can be made in `folder` (created if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return False
    os.close(handle)
    os.unlink(probe)
    return True


def _private_folder(wanted: Path) -> Path:
    """A folder in the temporary folder that only this user can write (a library loaded from a folder
    others can write would run their code); OSError naming both folders if there is none."""
    uid = os.getuid()
    private = Path(tempfile.gettempdir()) / f"caidllm-native-{uid}"
    try:
        private.mkdir(mode=0o700, exist_ok=True)
        info = private.lstat()
    except OSError as error:
        raise OSError(f"{wanted} is not writable, nor is {private} ({error})") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o022:
        raise OSError(f"{wanted} is not writable, and {private} is not a folder only this user can write")
    _log.info("moe_kernel 'native': %s is not writable; building in %s", wanted, private)
    return private


def _open(compiler: str) -> ctypes.CDLL:
    """The built library, loaded; a cached file that does not load (truncated, say) built again."""
    library = build(compiler)
    try:
        return ctypes.CDLL(str(library))
    except OSError as error:
        _log.info("moe_kernel 'native': %s does not load (%s); building it again", library.name, error)
        library.unlink(missing_ok=True)
        return ctypes.CDLL(str(build(compiler)))


class _Library:
    """The loaded library, or the reason there is none; built once per process, on first use."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loaded = False
        self.functions = None
        self.reason = ""
        self.dtype_bits = 0

    def get(self):
        with self._lock:
            if not self._loaded:
                self._loaded = True
                self._load()
        return self.functions

    def _load(self) -> None:
        compiler = find_compiler()
        if compiler is None:
            self.reason = f"no C++ compiler found ({', '.join(COMPILERS)}, or $CXX)"
        else:
            try:
                lib = _open(compiler)
            except (OSError, subprocess.SubprocessError) as error:  # SubprocessError: the build timed out
                self.reason = f"building {SOURCE.name} failed: {error}"
            else:
                self.dtype_bits = lib.caidllm_moe_dtypes()
                lib.caidllm_moe_experts.restype = ctypes.c_int
                lib.caidllm_moe_experts.argtypes = [
                    ctypes.c_int,
                    *[ctypes.c_void_p] * 5,
                    *[ctypes.c_int64] * 3,
                    ctypes.c_void_p,
                ]
                self.functions = lib
        if self.reason:
            _log.info("moe_kernel 'native' unavailable: %s", self.reason)


_LIBRARY = _Library()


def why_unavailable(dtype: torch.dtype) -> str | None:
    """None where the native kernel runs `dtype` here; else the reason, in words."""
    if dtype not in DTYPE_CODES:
        return f"it runs float32 and bfloat16, not {str(dtype).removeprefix('torch.')}"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"it is written for x86-64 CPUs, not {platform.machine()}"
    if _LIBRARY.get() is None:
        return _LIBRARY.reason
    if not _LIBRARY.dtype_bits & _DTYPE_BITS[dtype]:
        needs = "AVX-512 BF16" if dtype == torch.bfloat16 else "AVX-512"
        return f"this CPU lacks {needs} (or the compiler does not know it)"
    return None


def bf16_on_amx() -> bool:
    """Whether bf16 experts (widths multiples of 32) run on AMX here rather than AVX-512 BF16."""
    return _LIBRARY.get() is not None and bool(_LIBRARY.dtype_bits & 4)


def run_routed(
    routed: torch.Tensor,
    counts: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    threads: int = 1,
) -> torch.Tensor:
    """Each expert's SwiGLU on its rows of `routed` [pairs, hidden] (sorted by expert, counts[e]
    rows each, counts on the CPU). All contiguous CPU tensors of one dtype. One call into the library, or one
    per thread on runs of experts of about equal work (ctypes lets go of the GIL during each)."""
    on_host = _check_operands(routed, counts, gate, up, down)
    out = torch.empty_like(routed)
    calls = [(rows, slice(first, last)) for first, last, rows in expert_runs(on_host, threads)]

    def call(run) -> int:
        rows, experts = run
        return _LIBRARY.get().caidllm_moe_experts(
            DTYPE_CODES[routed.dtype],
            routed[rows].data_ptr(),
            gate[experts].data_ptr(),
            up[experts].data_ptr(),
            down[experts].data_ptr(),
            counts[experts].data_ptr(),
            experts.stop - experts.start,
            gate.shape[2],
            gate.shape[1],
            out[rows].data_ptr(),
        )

    others = [_pool(threads).submit(call, run) for run in calls[1:]]
    statuses = [call(run) for run in calls[:1]] + [future.result() for future in others]  # the first run here
    if any(statuses):
        raise MemoryError(
            f"the native MoE kernel failed (status {max(statuses)}: out of memory for its scratch)"
        )
    return out


def _check_operands(routed, counts, gate, up, down) -> list[int]:
    """ValueError for operands the library would read out of bounds (it trusts raw pointers); else
    the counts as a list (read once: one host read per layer, as the loop's)."""
    experts, inter, hidden = gate.shape
    tensors = {"routed": routed, "gate": gate, "up": up, "down": down}
    problems = [
        f"{name} is not a contiguous CPU {routed.dtype} tensor"
        for name, t in tensors.items()
        if not (t.is_contiguous() and t.device.type == "cpu" and t.dtype == routed.dtype)
    ]
    if routed.dtype not in DTYPE_CODES:
        problems.append(f"dtype {routed.dtype} is neither float32 nor bfloat16")
    if tuple(up.shape) != (experts, inter, hidden) or tuple(down.shape) != (experts, hidden, inter):
        problems.append(
            f"shapes gate {list(gate.shape)}, up {list(up.shape)}, down {list(down.shape)} disagree"
        )
    if not (
        counts.dtype == torch.int64
        and counts.is_contiguous()
        and counts.device.type == "cpu"
        and tuple(counts.shape) == (experts,)
    ):
        problems.append(f"counts must be {experts} contiguous int64 on the CPU")
    else:
        on_host = counts.tolist()
        if min(on_host, default=0) < 0:
            problems.append(f"counts must be >= 0, got {min(on_host)}")
        elif routed.dim() != 2 or tuple(routed.shape) != (sum(on_host), hidden):
            problems.append(f"routed {list(routed.shape)} is not [{sum(on_host)}, {hidden}]")
    if problems:
        raise ValueError(f"native MoE kernel: {'; '.join(problems)}")
    return on_host


def expert_runs(counts: list[int], threads: int) -> list[tuple[int, int, slice]]:
    """At most `threads` runs of consecutive experts (first, last + 1, their rows), each about an
    equal share of the work: an expert it computes costs its weights' read plus its rows."""
    work = [(1 + abs(c) / 8) if c > 0 else 0 for c in counts]
    share, runs, first, done, row, start_row = sum(work) / max(threads, 1), [], 0, 0.0, 0, 0
    for e, count in enumerate(counts):
        done, row = done + work[e], row + abs(count)
        if done >= share * (len(runs) + 1) - 1e-9 and len(runs) < threads - 1:
            runs.append((first, e + 1, slice(start_row, row)))
            first, start_row = e + 1, row
    runs.append((first, len(counts), slice(start_row, row)))
    return [run for run in runs if run[2].stop > run[2].start]


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _POOLS:
        _POOLS[threads] = ThreadPoolExecutor(
            max_workers=max(threads - 1, 1), thread_name_prefix="caidllm-moe"
        )
    return _POOLS[threads]
