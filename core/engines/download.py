"""The download engine: a hub id, a local directory, or ``init:<preset>`` random weights.

Packs bind :func:`download_stage` in their declared stages and supply only how to build a
random-weight checkpoint from one of their tiny presets (how tests and demos run offline)::

    "download": Stage("mmcore.engines.download:download_stage", parts={"build_init": "mm_pack_x.tiny:build_init_checkpoint"})
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mmcore.framework.context import StageContext
from mmcore.errors import StageError
from mmcore.framework.files import sha256_file
from mmcore.framework.pack import StageResult

#: The running stage's ``model.trust_remote_code`` (set by the runner; off by default).
TRUST_REMOTE_CODE: ContextVar[bool] = ContextVar("mmcore_trust_remote_code", default=False)


def remote_code() -> dict[str, bool]:
    """Keyword arguments for transformers' ``Auto*.from_pretrained``: checkpoint code runs only
    when the user set ``model.trust_remote_code=true`` for this run."""
    return {"trust_remote_code": TRUST_REMOTE_CODE.get()}


#: ``(preset name, output directory, seed) -> None``: writes a loadable checkpoint folder.
InitBuilder = Callable[[str, Path, int], None]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def download_stage(ctx: StageContext, upstream: Mapping[str, Any], *, build_init: InitBuilder, subfolders: Sequence[str] = (), check_parts: Callable[[Path], None] | None = None) -> StageResult:
    """The download stage: :func:`download_model`, then, for a multi-part checkpoint (a
    diffusers pipeline), require each of ``subfolders`` in the folder it found.

    ``check_parts`` (a pack part, SDK 1.30): called with the folder on the local main process, for
    the parts a pack reads with its own code in a layout diffusers does not know (a released VAE
    folder: Open-Sora Plan's WF-VAE, Step-Video's Video-VAE); its ``ValueError`` (one line naming
    the file and what does not fit) becomes the stage's error."""
    result = download_model(ctx, build_init)
    folder = Path(result.outputs["model"])
    folder = folder if folder.is_absolute() else ctx.stage_dir / folder
    missing = [part for part in subfolders if not (folder / part).is_dir()]
    if missing and ctx.world.is_local_main:
        raise StageError(f"{folder}: missing {', '.join(f'{m}/' for m in missing)}: not a checkpoint of this family (it needs {', '.join(subfolders)})")
    if ctx.world.is_local_main:
        check_checkpoint_folder(folder)
        if check_parts is not None:
            try:
                check_parts(folder)
            except ValueError as exc:
                raise StageError(str(exc)) from None
    return result


def check_checkpoint_folder(folder: Path) -> None:
    """A downloaded checkpoint is complete and readable before anything converts it: a config
    (``config.json``, or ``model_index.json`` for a multi-part pipeline), every safetensors
    file's header consistent with its size (truncation, garbage), every file a sharded
    index names present and every tensor it maps in that file."""
    import json

    from mmcore.checkpoint.safetensors_files import SAFE_INDEX, read_header

    if not (folder / "config.json").is_file() and not (folder / "model_index.json").is_file():
        raise StageError(f"{folder}: no config.json (nor model_index.json): not a complete checkpoint folder")
    for part in [folder, *(p.parent for p in sorted(folder.glob("*/config.json")))]:
        headers = {path.name: read_header(path) for path in sorted(part.glob("*.safetensors"))}
        index_file = part / SAFE_INDEX
        if not index_file.is_file():
            continue
        try:
            weight_map = json.loads(index_file.read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise StageError(f"{index_file}: unreadable index ({type(exc).__name__}: {exc})") from None
        for tensor, file in weight_map.items():
            if file not in headers:
                raise StageError(f"{index_file}: tensor {tensor!r} is in {file}, which is missing from {part}")
            if tensor not in headers[file]:
                raise StageError(f"{part / file}: tensor {tensor!r}, listed in {SAFE_INDEX}, is not in the file")


def download_model(ctx: StageContext, build_init: InitBuilder, *, default_source: str | None = None) -> StageResult:
    """Resolve ``model.source`` into a checkpoint folder, recorded as output ``model``.

    * ``init:<preset>``: ``build_init`` writes random weights into the stage directory.
    * a local directory: used in place; its files are hashed as the stage's inputs.
    * ``org/name``: ``huggingface_hub.snapshot_download`` (resumable, ``model.revision`` pinned,
      ``model.allow_patterns``, offline = local cache only); the sha256 of every file fetched
      goes into the manifest.
    """
    source = ctx.config.model.source or default_source
    if not source:
        raise StageError("model.source is not set: give --model <hub id | local dir | init:<preset>>")
    if source.startswith("init:"):
        preset = source.split(":", 1)[1]
        out = ctx.stage_dir / "model"
        if ctx.world.is_local_main:
            build_init(preset, out, ctx.seed)
        return StageResult(outputs={"model": "model"}, metrics={"source": source}, notes=[f"random-weight checkpoint from preset {preset!r}"])
    local = Path(source).expanduser()
    if local.exists():
        if not local.is_dir():
            raise StageError(f"{local}: model.source must be a directory with the checkpoint")
        if not any(local.glob("*.safetensors")) and not any(local.glob("*/*.safetensors")):
            raise StageError(f"{local}: no .safetensors files in the model directory")
        from mmcore.engines.convert import refuse_links_out

        refuse_links_out(local)  # found now, not when the export would copy what they lead to
        ctx.record_input(local)
        return StageResult(outputs={"model": str(local.absolute())}, metrics={"source": str(local.absolute())})
    if not _HUB_ID.match(source):
        raise StageError(f"model.source {source!r} is neither an existing directory, init:<preset>, nor a hub id like org/name")
    return _from_hub(ctx, source)


def _from_hub(ctx: StageContext, repo_id: str) -> StageResult:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    offline = ctx.offline or os.environ.get("HF_HUB_OFFLINE") == "1"
    try:
        path = Path(
            snapshot_download(
                repo_id,
                revision=ctx.config.model.revision,
                allow_patterns=ctx.config.model.allow_patterns,
                local_files_only=offline,
            )
        )
    except GatedRepoError:
        raise StageError(f"{repo_id}: a gated repository: accept its terms on its hub page with your account, and set HF_TOKEN to a token of that account") from None
    except LocalEntryNotFoundError as exc:
        if offline:
            why = "--offline or run.offline" if ctx.offline else "HF_HUB_OFFLINE=1"
            raise StageError(f"{repo_id}: not in the local hub cache, and offline mode is on ({why})", hint="download it once online, or point --model at a local directory") from None
        # online, the hub unreachable: huggingface_hub looked in the cache instead and says so;
        # its cause is what went wrong on the network
        cause = exc.__cause__ or exc.__context__
        reason = f"{type(cause).__name__}: {' '.join(str(cause).split())}" if cause is not None else "no answer"
        raise StageError(
            f"{repo_id}: the hub at {hub_endpoint()} could not be reached ({reason}), and the model is not in the local hub cache",
            hint="check the network or proxy (HTTPS_PROXY, HF_ENDPOINT), or point --model at a local directory",
        ) from None
    except RepositoryNotFoundError:
        raise StageError(f"{repo_id}: no such repository on the hub (or it is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise StageError(f"{repo_id}: revision {ctx.config.model.revision!r} does not exist") from None
    except (HfHubHTTPError, OSError) as exc:
        raise StageError(f"{repo_id}: download failed: {exc}", hint="rerun to resume; --offline uses the local cache") from None
    hashes = {str(p.relative_to(path)): sha256_file(p) for p in sorted(path.rglob("*")) if p.is_file()}
    commit = path.name  # the hub cache keeps a snapshot per resolved commit: snapshots/<sha>/
    notes = [f"{repo_id} at commit {commit}"]
    if not offline:
        try:
            from huggingface_hub import HfApi

            info = HfApi().model_info(repo_id, revision=commit, files_metadata=True)
        except (HfHubHTTPError, OSError) as exc:
            notes.append(f"could not fetch the hub's file hashes to compare ({type(exc).__name__}); files are recorded by their local sha256")
        else:
            bad = hub_hash_mismatches(hashes, info.siblings or [])
            if bad:
                raise StageError(
                    f"{path / bad[0]}: its sha256 differs from the hub's for {repo_id}@{commit}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""),
                    hint="delete the file from the hub cache and download again",
                )
            notes.append("every large file matches the hub's sha256")
    return StageResult(outputs={"model": str(path)}, metrics={"source": repo_id, "revision": ctx.config.model.revision, "commit": commit, "sha256": hashes}, notes=notes)


def hub_endpoint() -> str:
    """The hub huggingface_hub talks to (``HF_ENDPOINT``, else huggingface.co)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def hub_hash_mismatches(local: Mapping[str, str], siblings: Sequence[Any]) -> list[str]:
    """Files whose local sha256 differs from the hub's (``RepoSibling.lfs.sha256``: the hub
    publishes sha256 for LFS files, the weights; small git files are checked by git's own id)."""
    return [s.rfilename for s in siblings if s.lfs is not None and s.rfilename in local and local[s.rfilename] != s.lfs.sha256]
