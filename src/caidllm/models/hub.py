"""Hugging Face hub ids where a model folder is expected: ``ORG/NAME[@REVISION]``.

huggingface_hub resolves them (its cache, its token, HF_HUB_OFFLINE), fetching only what
the loader reads: config files, tokenizer files, safetensors weights and their index,
never ``.bin`` pickles. Every failure is one ModelLoadError line naming the id.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelLoadError

# What the loader reads (models/loading.py); nothing else is downloaded.
FILES_READ = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
]
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?")


def is_hub_id(name: str) -> bool:
    """ORG/NAME or ORG/NAME@REVISION (a relative path of two parts that does not exist locally looks the same:
    the caller checks the folder first)."""
    return bool(HUB_ID.fullmatch(name)) and not name.startswith((".", "~"))


def split_hub_id(name: str) -> tuple[str, str | None]:
    repo_id, _, revision = name.partition("@")
    return repo_id, revision or None


def download(name: str, cache_dir: str | Path | None = None) -> Path:
    """The local snapshot folder of hub id `name` (from the cache, or downloaded)."""
    from huggingface_hub import snapshot_download

    repo_id, revision = split_hub_id(name)
    folder = Path(
        _fetched(
            name,
            lambda: snapshot_download(
                repo_id, revision=revision, allow_patterns=FILES_READ, cache_dir=cache_dir
            ),
        )
    )
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{name}: the snapshot {folder} has no config.json: not a model in Hugging Face layout"
        )
    return folder


def download_file(name: str, filename: str) -> Path:
    """One file of hub id `name` (config.json, for `caidllm models`), from the cache or the hub."""
    from huggingface_hub import hf_hub_download

    repo_id, revision = split_hub_id(name)
    return Path(_fetched(name, lambda: hf_hub_download(repo_id, filename, revision=revision)))


def _fetched(name: str, fetch):
    """fetch()'s result, or its huggingface_hub error as one ModelLoadError line naming the id."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, revision = split_hub_id(name)
    at = f" at revision {revision!r}" if revision else ""
    try:
        return fetch()
    except RevisionNotFoundError:
        raise ModelLoadError(
            f"{name}: the hub has no revision {revision!r} of {repo_id} "
            "(a branch, tag or commit hash after @)"
        ) from None
    except GatedRepoError:
        raise ModelLoadError(
            f"{name}: {repo_id} is gated: accept its terms on huggingface.co and log in "
            "(huggingface-cli login, or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"{name}: no model {repo_id} on the hub (or it is private: log in with "
            "huggingface-cli login, or set HF_TOKEN)"
        ) from None
    except LocalEntryNotFoundError:
        raise ModelLoadError(
            f"{name}: no local folder of that name, not in the Hugging Face cache{at}, and the hub cannot be "
            f"reached (HF_HUB_OFFLINE=1 or no "
            f"network); download it where there is a network (huggingface-cli download {repo_id}"
            f"{' --revision ' + revision if revision else ''} --local-dir DIR) and pass --model DIR"
        ) from None
    except (HfHubHTTPError, OSError) as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise ModelLoadError(
            f"{name}: cannot fetch it from the hub: {type(error).__name__}: {first_line}"
        ) from None
