"""Hub ids (ORG/NAME[@REVISION]) resolved through huggingface_hub, offline (conftest sets
HF_HUB_OFFLINE=1), from a cache laid out as huggingface_hub lays it out:
models--ORG--NAME/{refs/main, snapshots/COMMIT/...}."""

import shutil

import pytest

import caidllm
from caidllm.cli import main
from caidllm.errors import ModelLoadError
from caidllm.models import hub
from helpers.checkpoint_files import write_checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An HF cache holding a snapshot of GSAI-ML/LLaDA-8B-Base at COMMIT (refs/main and tag v1 point to
    it)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    repo = cache / "models--GSAI-ML--LLaDA-8B-Base"
    built = write_checkpoint(tmp_path / "build", "GSAI-ML/LLaDA-8B-Base")
    shutil.copytree(built, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.mark.parametrize(
    "name", ["GSAI-ML/LLaDA-8B-Base", "GSAI-ML/LLaDA-8B-Base@v1", f"GSAI-ML/LLaDA-8B-Base@{COMMIT}"]
)
def test_hub_id_loads_from_the_cache_offline(hub_cache, name):
    lm = caidllm.load(name, device="cpu", dtype="float32")
    assert lm.path == hub_cache / "models--GSAI-ML--LLaDA-8B-Base" / "snapshots" / COMMIT
    assert lm.checkpoint.hub_id == "GSAI-ML/LLaDA-8B-Base" and lm.name == "GSAI-ML/LLaDA-8B-Base"
    assert lm.chat_default is False


def test_bad_revision_names_it(hub_cache, capsys):
    with pytest.raises(
        ModelLoadError,
        match="GSAI-ML/LLaDA-8B-Base@nope: no local folder of that name, not in the "
        "Hugging Face cache at revision 'nope', and the hub cannot be reached",
    ):
        caidllm.load("GSAI-ML/LLaDA-8B-Base@nope")
    assert main(["generate", "hi", "--model", "GSAI-ML/LLaDA-8B-Base@nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "revision 'nope'" in err[0] and "--revision nope" in err[0]


def test_revision_unknown_to_the_hub_names_it(monkeypatch):
    import httpx
    from huggingface_hub.errors import RevisionNotFoundError

    url = "https://huggingface.co/api/models/org/name/revision/bad"
    response = httpx.Response(404, request=httpx.Request("GET", url))

    def missing(*args, **kwargs):  # what the hub answers online for a revision it does not have
        raise RevisionNotFoundError("404 Client Error: Revision Not Found", response=response)

    monkeypatch.setattr("huggingface_hub.snapshot_download", missing)
    with pytest.raises(ModelLoadError, match="org/name@bad: the hub has no revision 'bad' of org/name"):
        hub.download("org/name@bad")


def test_nothing_cached_offline_is_one_line_naming_the_id_and_the_folder_alternative(hub_cache, capsys):
    with pytest.raises(ModelLoadError) as error:
        caidllm.load("Dream-org/Dream-v0-Base-7B")
    line = str(error.value)
    assert "\n" not in line and line.startswith(
        "Dream-org/Dream-v0-Base-7B: no local folder of that name, not in the Hugging Face cache"
    )
    assert "--local-dir DIR" in line and "--model DIR" in line
    assert main(["generate", "hi", "--model", "Dream-org/Dream-v0-Base-7B"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("caidllm: error: Dream-org/Dream-v0-Base-7B: no local folder")


def test_only_the_files_the_loader_reads_are_fetched(monkeypatch, tmp_path):
    seen = {}

    def fake(repo_id, revision=None, allow_patterns=None, cache_dir=None):
        seen.update(repo_id=repo_id, revision=revision, patterns=allow_patterns)
        return str(write_checkpoint(tmp_path, "apple/DiffuCoder-7B-Instruct"))

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake)
    lm = caidllm.load("apple/DiffuCoder-7B-Instruct@main", device="cpu", dtype="float32")
    assert seen["repo_id"] == "apple/DiffuCoder-7B-Instruct" and seen["revision"] == "main"
    import fnmatch

    fetched = lambda name: any(fnmatch.fnmatch(name, p) for p in seen["patterns"])  # noqa: E731
    assert not fetched("pytorch_model.bin") and not fetched("pytorch_model-00001-of-00002.bin")
    assert all(
        fetched(f)
        for f in (
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model-00001-of-00004.safetensors",
            "model.safetensors.index.json",
        )
    )
    assert lm.checkpoint.hub_id == "apple/DiffuCoder-7B-Instruct"


def test_a_bin_only_folder_is_refused_with_the_reason(tmp_path):
    path = write_checkpoint(tmp_path, "GSAI-ML/LLaDA-8B-Base")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pytorch_model.bin found: caidllm reads safetensors only"):
        caidllm.load(path)


@pytest.mark.parametrize(
    "name, is_id",
    [
        ("GSAI-ML/LLaDA-8B-Base", True),
        ("org/name@v1.0", True),
        ("./org/name", False),
        ("/abs/path", False),
        ("tiny", False),
        ("a/b/c", False),
        ("random:llada-8b", False),
    ],
)
def test_what_reads_as_a_hub_id(name, is_id):
    assert hub.is_hub_id(name) is is_id
