"""The embedded tiny model travels inside the wheel and loads from an install."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "MODEL_CARD.md")


@pytest.mark.parametrize("model", ["tiny", "tiny-bd", "tiny-moe", "tiny-dg"])
def test_embedded_models_are_small_and_complete(model):
    folder = ROOT / "src" / "caidllm" / "assets" / model
    for name in TINY_FILES:
        assert (folder / name).is_file(), f"missing {name} in {folder}"
    total = sum(p.stat().st_size for p in folder.iterdir())
    assert total <= 25 * 1024 * 1024, f"the embedded model takes {total / 2**20:.1f} MB (limit 25 MB)"


def test_load_tiny_from_an_installed_wheel(tmp_path):
    dist, site = tmp_path / "dist", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], check=True
    )
    (wheel,) = dist.glob("caidllm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for model in ("tiny", "tiny-bd", "tiny-moe", "tiny-dg"):
        for name in TINY_FILES:
            assert f"caidllm/assets/{model}/{name}" in names
    assert "caidllm/models/moe_native.cpp" in names  # the native MoE kernel's source, compiled on first use
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
    )
    code = (
        "import caidllm; lm = caidllm.load('tiny', device='cpu'); "
        "print(lm.path); r = lm.generate(['not ( True ) is'], method='cai', gen_length=64, "
        "block_length=32)[0]; "
        "print(r.nfe)"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    path, nfe = out.stdout.split()
    assert Path(path).resolve().is_relative_to(site.resolve())
    assert int(nfe) >= 1
