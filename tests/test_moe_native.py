"""The native MoE kernel (models/moe_native.cpp, built by models/moe_native.py): its build cache,
what happens without a compiler, where auto picks it, bf16 layers (AMX and dot products) against the
loop, batch invariance in bf16, threads, and its refusals (no gradient, quantized experts, a kernel
that cannot run named as such). Its parity with the loop on every family's model, in fp32 and bf16,
and fp32 batch invariance are in test_moe_kernels.py (every kernel). Skipped, with the reason,
where the kernel cannot run (no C++ compiler, no AVX-512)."""

import logging
import os

import pytest
import torch

import caidllm
from caidllm.errors import InputError
from caidllm.models import moe_kernels, moe_native
from caidllm.models.moe import set_moe_kernel
from caidllm.models.moe_experts import StackedExperts
from caidllm.models.moe_kernels import pick_kernel
from test_moe import LLADA2_LIKE, random_moe
from test_moe_kernels import RANDOM

MISSING = moe_native.why_unavailable(torch.float32)
needs_native = pytest.mark.skipif(bool(MISSING), reason=f"native: {MISSING}")


@pytest.fixture
def no_compiler(monkeypatch):
    """A fresh library state on a machine with no C++ compiler."""
    monkeypatch.setattr(moe_native, "_LIBRARY", moe_native._Library())
    monkeypatch.setattr(moe_native, "find_compiler", lambda: None)


@needs_native
def test_the_library_is_built_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CAIDLLM_NATIVE_CACHE", str(tmp_path / "cache"))
    compiler = moe_native.find_compiler()
    library = moe_native.build(compiler)
    assert library.parent == tmp_path / "cache" and library.name.startswith("moe_native-")
    made = library.stat().st_mtime_ns
    assert moe_native.build(compiler) == library and library.stat().st_mtime_ns == made
    assert [p.name for p in library.parent.iterdir()] == [library.name]  # no temporary file left


@needs_native
def test_a_cache_folder_that_cannot_be_written_builds_in_a_private_temporary_one(monkeypatch, tmp_path):
    """A read-only home, say (here: the cache under a file, which no one can make): the library is built
    in a folder of the temporary folder that only this user can write, and found there next time."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("CAIDLLM_NATIVE_CACHE", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(moe_native.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    compiler = moe_native.find_compiler()
    library = moe_native.build(compiler)
    private = tmp_path / "tmp" / f"caidllm-native-{os.getuid()}"
    assert library.parent == private and private.stat().st_mode & 0o777 == 0o700
    assert moe_native.build(compiler) == library
    private.chmod(0o777)  # a folder others can write is never loaded from
    with pytest.raises(OSError, match="is not a folder only this user can write"):
        moe_native.build(compiler)


def test_without_a_compiler_auto_runs_another_kernel_and_native_is_refused(no_compiler, caplog, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # where auto would pick native
    moe = random_moe(**LLADA2_LIKE)
    x = torch.randn(6, 16)
    with caplog.at_level(logging.INFO, logger="caidllm.models.moe_native"), torch.no_grad():
        assert pick_kernel(moe.experts, x, choices=4) != "native"
        assert pick_kernel(moe.experts, x.bfloat16(), choices=4) != "native"
        moe(x)
    assert [r.getMessage() for r in caplog.records] == [
        "moe_kernel 'native' unavailable: no C++ compiler found (g++, c++, clang++, or $CXX)"
    ]
    with pytest.raises(InputError, match=r"moe_kernel 'native' cannot run here: no C\+\+ compiler found"):
        caidllm.load(RANDOM["llada2"], device="cpu", moe_kernel="native")


def test_the_command_line_names_why_native_cannot_run(no_compiler, capsys):
    from caidllm.cli import main

    argv = ["generate", "hi", "--model", RANDOM["llada2"], "--device", "cpu", "--gen-length", "32", "--json"]
    assert main([*argv, "--moe-kernel", "native"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "caidllm: error: moe_kernel 'native' cannot run here: no C++ compiler found "
        "(g++, c++, clang++, or $CXX)"
    ]


def test_a_compiler_that_fails_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(moe_native, "_LIBRARY", moe_native._Library())
    monkeypatch.setenv("CAIDLLM_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    assert moe_native.why_unavailable(torch.float32).startswith(
        "building moe_native.cpp failed: false failed"
    )
    assert list(tmp_path.iterdir()) == []  # nothing half-written left in the cache


def test_native_is_refused_where_it_cannot_run():
    moe = random_moe(**LLADA2_LIKE)
    moe.kernel = "native"
    with pytest.raises(
        InputError, match="moe_kernel 'native' cannot run here: it runs float32 and bfloat16, not"
    ):
        with torch.no_grad():
            moe.half()(torch.randn(3, 16).half())
    with pytest.raises(InputError, match="moe_kernel 'native' cannot run here: it runs on a CPU, not meta"):
        caidllm.load(RANDOM["llada2"], device="meta", moe_kernel="native")


@needs_native
def test_native_computes_no_gradient_and_auto_trains_without_it():
    moe = random_moe(**LLADA2_LIKE)
    x = torch.randn(40, 16, requires_grad=True)
    moe.kernel = "native"
    with pytest.raises(InputError, match="moe_kernel 'native' cannot run here: it computes no gradient"):
        moe(x)
    assert pick_kernel(moe.experts, x, choices=4) != "native"
    with torch.no_grad():
        assert pick_kernel(moe.experts, x, choices=4) == (
            "native" if torch.get_num_threads() <= 2 else "sized"
        )


def test_quantized_experts_refuse_native():
    pytest.importorskip("torchao")
    with pytest.raises(InputError, match="moe_kernel 'native' runs stacked full-precision experts"):
        caidllm.load(RANDOM["llada2"], device="cpu", quantize="int8", moe_kernel="native")
    lm = caidllm.load(RANDOM["llada2"], device="cpu", quantize="int8")
    with pytest.raises(InputError, match="moe_kernel 'native' runs stacked full-precision experts"):
        set_moe_kernel(lm.model, "native")


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_picks_native_on_one_cpu_thread_where_it_runs(dtype, monkeypatch):
    if moe_native.why_unavailable(dtype):
        pytest.skip(f"native in {dtype}: {moe_native.why_unavailable(dtype)}")
    if dtype == torch.bfloat16 and not moe_native.bf16_on_amx():
        pytest.skip("bf16 natively only on AMX (test_auto_runs_bf16_natively_only_on_amx...)")
    experts = random_moe(**{**LLADA2_LIKE, "hidden_size": 64, "moe_intermediate_size": 32}).to(dtype).experts
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    with torch.no_grad():
        for tokens in (1, 4, 128):
            assert pick_kernel(experts, torch.zeros(tokens, 64, dtype=dtype), choices=4) == "native"
        # measured at one and two threads: at two, fp32 from one row per expert on average (16 experts here)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
        assert pick_kernel(experts, torch.zeros(4, 64, dtype=dtype), choices=4) == "native"
        expected = "native" if dtype == torch.bfloat16 else "grouped"
        assert pick_kernel(experts, torch.zeros(3, 64, dtype=dtype), choices=4) == expected
        monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
        assert pick_kernel(experts, torch.zeros(4, 64, dtype=dtype), choices=4) != "native"


def _bf16_layer(hidden=64, inter=32):
    if moe_native.why_unavailable(torch.bfloat16):
        pytest.skip(f"native in bf16: {moe_native.why_unavailable(torch.bfloat16)}")
    return random_moe(**{**LLADA2_LIKE, "hidden_size": hidden, "moe_intermediate_size": inter}).bfloat16()


def _by(moe, kernel, x):
    moe.kernel = kernel
    with torch.no_grad():
        return moe(x)


@needs_native
@pytest.mark.parametrize("tokens", [1, 9, 70, 200])
def test_bf16_layers_by_amx_or_dot_products_give_the_loops_outputs(tokens):
    """Widths multiples of 32 run on AMX where there is one (16 and 32 rows per pass: 200 tokens give
    the 16 experts about 50 rows each), others on AVX-512 BF16's dot products."""
    for hidden, inter in ((64, 32), (48, 24)):
        moe = _bf16_layer(hidden, inter)
        x = torch.randn(tokens, hidden).bfloat16()
        torch.testing.assert_close(
            _by(moe, "native", x).float(), _by(moe, "loop", x).float(), atol=2e-2, rtol=2e-2
        )


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_inputs_summed_a_block_at_a_time_give_the_loops_outputs(dtype):
    """Inputs longer than the kernel's block of 1024 (the gate's 1100: two blocks, the second ending
    in a part vector), 1-12 rows per expert."""
    if moe_native.why_unavailable(dtype):
        pytest.skip(f"native in {dtype}: {moe_native.why_unavailable(dtype)}")
    moe = random_moe(**{**LLADA2_LIKE, "hidden_size": 1100, "moe_intermediate_size": 40}).to(dtype)
    x = torch.randn(30, 1100).to(dtype)
    expected = _by(moe, "loop", x).float()
    scale = expected.abs().max().item()  # about 1200: fp32's rounding of the loop itself is 5e-4 from float64
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        _by(moe, "native", x).float(), expected, atol=tolerance * scale, rtol=tolerance
    )


@needs_native
@pytest.mark.parametrize("hidden, inter", [(64, 32), (48, 24), (400, 100)])
def test_a_bf16_row_does_not_depend_on_its_batch(hidden, inter):
    """However many rows share a row's expert (1 alone, 2-20 together): on AMX (widths multiples of
    32) and on the dot products (others; sums long enough, 400, for another order to show). The
    routing is fixed (the router's fp32 matmul has batch-dependent last bits of its own)."""
    moe = _bf16_layer(hidden, inter)
    x = torch.randn(40, hidden).bfloat16()
    with torch.no_grad():
        chosen, weights = moe.gate(x)
        together = moe_kernels.native_kernel(moe.experts, x, chosen, weights)
        alone = [
            moe_kernels.native_kernel(moe.experts, x[i : i + 1], chosen[i : i + 1], weights[i : i + 1])[0]
            for i in range(len(x))
        ]
    assert [i for i in range(len(x)) if not torch.equal(alone[i], together[i])] == []


@needs_native
@pytest.mark.parametrize("hidden, inter, amx", [(64, 32, True), (64, 32, False), (48, 24, True)])
def test_auto_runs_bf16_natively_only_on_amx_and_native_runs_every_expert_itself(
    hidden, inter, amx, monkeypatch
):
    """bf16 without AMX (no AMX, or widths not multiples of 32): the dot products compute slower than
    sized's matmul from about 6 rows an expert, and handing such experts to sized would make a row's
    sums depend on its batch: auto runs sized there; native, when asked, runs every expert itself."""
    moe = _bf16_layer(hidden, inter)
    monkeypatch.setattr(moe_native, "bf16_on_amx", lambda: amx and moe_native._LIBRARY.dtype_bits & 4 != 0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(moe_kernels, "_sized_expert", None)  # native must not call it
    x = torch.randn(40, hidden).bfloat16()
    on_amx = moe_native.bf16_on_amx() and hidden % 32 == 0 and inter % 32 == 0
    with torch.no_grad():
        assert pick_kernel(moe.experts, x, choices=4) == ("native" if on_amx else "sized")
    torch.testing.assert_close(
        _by(moe, "native", x).float(), _by(moe, "loop", x).float(), atol=2e-2, rtol=2e-2
    )


def test_experts_are_divided_among_threads_in_runs_of_about_equal_work():
    runs = moe_native.expert_runs
    assert runs([0, 3, 0, -5, 2, 1, 0, 4], 1) == [(0, 8, slice(0, 15))]
    # -5: rows, no work
    assert runs([0, 3, 0, -5, 2, 1, 0, 4], 2) == [
        (0, 5, slice(0, 10)),
        (5, 8, slice(10, 15)),
    ]
    assert runs([1] * 10, 4) == [
        (0, 3, slice(0, 3)),
        (3, 5, slice(3, 5)),
        (5, 8, slice(5, 8)),
        (8, 10, slice(8, 10)),
    ]
    assert runs([5], 4) == [(0, 1, slice(0, 5))] and runs([0, 0, 0], 2) == []


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_threads_give_one_threads_outputs_exactly(dtype, monkeypatch):
    if moe_native.why_unavailable(dtype):
        pytest.skip(f"native in {dtype}: {moe_native.why_unavailable(dtype)}")
    moe = random_moe(**{**LLADA2_LIKE, "hidden_size": 64, "moe_intermediate_size": 32}).to(dtype)
    x = torch.randn(25, 64).to(dtype)
    alone = _by(moe, "native", x)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert torch.equal(_by(moe, "native", x), alone)


def test_the_kernel_names_are_offered_on_the_command_line():
    import argparse

    from caidllm.options import add_model_arguments

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert parser.parse_args(["--moe-kernel", "native"]).moe_kernel == "native"
    choices = next(a.choices for a in parser._actions if a.dest == "moe_kernel")
    assert list(choices) == moe_kernels.kernel_names()


@needs_native
def test_a_cached_library_that_does_not_load_is_built_again(monkeypatch, tmp_path):
    """A truncated file in the cache (a machine that went down after the rename, say) is not the
    end of the kernel on this machine: it is compiled again."""
    monkeypatch.setenv("CAIDLLM_NATIVE_CACHE", str(tmp_path))
    library = moe_native.build(moe_native.find_compiler())
    library.write_bytes(b"")
    monkeypatch.setattr(moe_native, "_LIBRARY", moe_native._Library())
    assert moe_native.why_unavailable(torch.float32) is None
    assert library.stat().st_size > 0


def test_operands_the_library_would_overrun_are_refused_before_the_call():
    """It reads raw pointers: a wrong shape, stride, dtype or count is a ValueError, not memory corruption."""
    gate, down = torch.zeros(2, 8, 16), torch.zeros(2, 16, 8)
    counts, routed = torch.tensor([2, 1]), torch.zeros(3, 16)
    cases = {
        "routed .3, 16. is not .4, 16.": (torch.zeros(3, 16), torch.tensor([3, 1]), gate, gate, down),
        "down is not a contiguous": (
            routed,
            counts,
            gate,
            gate,
            down.transpose(1, 2).contiguous().transpose(1, 2),
        ),
        "shapes gate .2, 8, 16., up .2, 8, 16., down .2, 8, 16. disagree": (routed, counts, gate, gate, gate),
        "counts must be 2 contiguous int64": (routed, counts.int(), gate, gate, down),
        "up is not a contiguous CPU torch.float32": (routed, counts, gate, gate.bfloat16(), down),
        "counts must be >= 0, got -1": (routed, torch.tensor([4, -1]), gate, gate, down),
    }
    for message, operands in cases.items():
        with pytest.raises(ValueError, match=message):
            moe_native.run_routed(*operands)


ODD_SHAPES = [  # experts, hidden, inter, choices, tokens: widths off the vector and tile sizes, one
    (1, 16, 20, 1, 5),
    (3, 20, 33, 3, 7),  # expert, every expert chosen, inputs over the block of
    (4, 48, 1000, 2, 9),
    (2, 17, 31, 2, 40),  # 1024, experts of 40-70 rows (AMX: passes of 32)
    (5, 64, 32, 5, 70),
    (3, 1030, 24, 2, 11),
    (7, 15, 1, 3, 13),
    (3, 32, 64, 3, 50),
]


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_odd_shapes_give_the_loops_outputs_whatever_the_batch_and_threads(dtype, monkeypatch):
    if moe_native.why_unavailable(dtype):
        pytest.skip(f"native in {dtype}: {moe_native.why_unavailable(dtype)}")
    generator = torch.Generator().manual_seed(0)
    for experts, hidden, inter, k, tokens in ODD_SHAPES:
        stacked = StackedExperts(experts, hidden, inter)
        with torch.no_grad():
            for p in stacked.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * hidden**-0.5)
        stacked = stacked.to(dtype)
        x = torch.randn(tokens, hidden, generator=generator).to(dtype)
        chosen = torch.stack([torch.randperm(experts, generator=generator)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, generator=generator)
        with torch.no_grad():
            got = moe_kernels.native_kernel(stacked, x, chosen, weights)
            expected = moe_kernels.loop_kernel(stacked, x, chosen, weights).float()
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            scale = expected.abs().max().item()
            torch.testing.assert_close(got.float(), expected, atol=tolerance * scale, rtol=tolerance)
            for i in (0, tokens - 1):
                assert torch.equal(
                    moe_kernels.native_kernel(stacked, x[i : i + 1], chosen[i : i + 1], weights[i : i + 1])[
                        0
                    ],
                    got[i],
                )
            monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
            assert torch.equal(moe_kernels.native_kernel(stacked, x, chosen, weights), got)
            monkeypatch.undo()
