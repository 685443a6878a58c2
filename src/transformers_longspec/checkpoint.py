"""Saved LongSpec draft folders: checks run before their weights are loaded, and upload to the Hub.

A folder from `LongSpecDraft.save_pretrained` holds `config.json` (model_type "longspec_draft"),
`model.safetensors` and this package's remote-code modules. A partial copy or download, a truncated file, a
target's folder passed by mistake, or a checkpoint from another draft layout would otherwise load with randomly
initialised weights behind a warning; here each one raises a ValueError naming the problem and the fix.

This module is copied beside the weights by `save_pretrained` (remote code for `trust_remote_code=True`), so it
imports only the standard library, torch, safetensors and huggingface_hub (all installed with transformers).

Reference: transformers `PreTrainedModel.from_pretrained` (checkpoint layout, `output_loading_info`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from huggingface_hub import HfApi, constants, try_to_load_from_cache
from safetensors import SafetensorError, safe_open

MODEL_TYPE = "longspec_draft"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_FIX = "re-save the draft with draft.save_pretrained(folder) or download it again"
COMPACT_FIX = "write it again with draft.save_compact(path)"


def _local_path(path) -> Path:
    """`path` (str or os.PathLike) as a Path, "~" expanded."""
    return Path(os.path.expanduser(os.fspath(path)))


def local_draft_folder(name_or_path, subfolder: str = "", hub_kwargs: dict | None = None) -> Path | None:
    """The local folder `name_or_path` names, or None when it is a Hub repository id.

    Args:
        name_or_path: what the user passed to `from_pretrained` (str or os.PathLike).
        subfolder: `from_pretrained`'s `subfolder` argument.
        hub_kwargs: `from_pretrained`'s keyword arguments: when given, a Hub id that is not in the local cache is
            looked up once on the Hub (`_check_hub_repo`), without the download client's retries.
    Returns: the folder, or None for a Hub id (left to transformers).
    Raises: ValueError if it names a file, or a folder that does not exist: a path that cannot be a Hub repository id
        `owner/name` (absolute; starting with ".", "~"; no "/" or more than one; characters a Hub id cannot hold) or
        whose first part is a local folder (`drafts/mine` where `drafts/` exists); with `hub_kwargs`, also an
        `owner/name` that is neither a folder nor a Hub repository, or the Hub cannot be reached. Said at once
        instead of after ~45 s of the Hub client's retries.
    """
    text = os.fspath(name_or_path)
    path = _local_path(text)
    if path.is_dir():
        return path / subfolder if subfolder else path
    if path.exists():
        raise ValueError(f"{text!r} is a file; pass the folder the draft was saved to (the one holding config.json), "
                         "or a compact draft file written by draft.save_compact")
    if not _could_be_hub_id(text):
        parent = path.parent
        where = f" ({str(parent)!r} holds no {path.name!r})" if str(parent) != "." and parent.is_dir() else ""
        raise ValueError(
            f"no folder {text!r}{where}; pass the folder a draft was saved to with save_pretrained (check the path "
            "and the working directory), or a Hub repository id of the form owner/name"
        )
    if hub_kwargs is not None:
        _check_hub_repo(text, hub_kwargs)
    return None


def _check_hub_repo(repo_id: str, hub_kwargs: dict) -> None:
    """Raise ValueError unless `repo_id` is cached locally or the Hub answers that the repository exists (one request;
    none with the Hub off: `HF_HUB_OFFLINE`, `local_files_only`)."""
    revision, token = hub_kwargs.get("revision"), hub_kwargs.get("token")
    if isinstance(try_to_load_from_cache(repo_id, CONFIG_NAME, cache_dir=hub_kwargs.get("cache_dir"),
                                         revision=revision), str):
        return
    if constants.HF_HUB_OFFLINE or hub_kwargs.get("local_files_only"):
        raise ValueError(
            f"no folder {repo_id!r} here ({os.getcwd()}), and no Hub repository of that name in the local cache (the "
            "Hub is off: HF_HUB_OFFLINE=1 or local_files_only=True); check the path, or download the draft once "
            "with the Hub on"
        )
    try:
        exists = HfApi().repo_exists(repo_id, token=token)
    except Exception as err:  # the HTTP client's connection errors: re-raised with both readings of the name
        raise ValueError(
            f"no folder {repo_id!r} here ({os.getcwd()}), and the Hub could not be reached to look for a repository "
            f"of that name ({type(err).__name__}: {err}); check the path, or the network (HF_HUB_OFFLINE=1 loads Hub "
            "drafts from the local cache only)"
        ) from err
    if not exists:
        raise ValueError(
            f"no folder {repo_id!r} here ({os.getcwd()}), and no Hub repository of that name (or it is private: pass "
            "token=...); check the path or the repository id"
        )


def _could_be_hub_id(text: str) -> bool:
    """True for `owner/name` made of Hub-legal characters whose `owner` is not a local folder."""
    parts = text.split("/")
    legal = all(part and part not in (".", "..") and all(c.isalnum() or c in "-_." for c in part) for part in parts)
    return legal and len(parts) == 2 and not os.path.isdir(parts[0]) and not text.startswith((".", "~"))


def read_draft_config(folder: Path) -> dict:
    """The folder's `config.json` as a dict, checked to describe a LongSpec draft.

    Raises: ValueError if config.json is missing, is not a JSON object, or has another model_type (e.g. a
        target's folder passed instead of the draft's).
    """
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"{folder} has no {CONFIG_NAME}, so it is not a saved LongSpec draft; {_FIX}")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); {_FIX}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object; {_FIX}")
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE:
        raise ValueError(
            f"{path} describes a {model_type!r} model, not a LongSpec draft (model_type {MODEL_TYPE!r}); pass the "
            "draft's folder, not the target's, or build a new draft with LongSpecDraft.from_target(target)"
        )
    return config


def _weight_files(folder: Path) -> list[Path]:
    index = folder / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index} is not a valid shard index ({err!r}); {_FIX}") from None
        files = [folder / n for n in names]
    else:
        files = [folder / WEIGHTS_NAME]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{folder} lacks {missing} (a partial copy or download?); {_FIX}")
    return files


def _saved_slices(folder: Path):
    """(tensor name, safetensors slice) of every tensor in the folder's weight files, from the headers alone."""
    for path in _weight_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    yield key, f.get_slice(key)
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{path} is truncated or not a safetensors file ({err}); {_FIX}") from None


def saved_tensor_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} read from the safetensors headers of the folder (no weights are read).

    Raises: ValueError if a weight file is missing, truncated or not a safetensors file.
    """
    return {key: tuple(piece.get_shape()) for key, piece in _saved_slices(folder)}


def saved_tensor_dtypes(folder: Path) -> set[str]:
    """The safetensors dtype names ("BF16", "F32", "I64", ...) of the tensors in the folder (headers only).

    Raises: ValueError as `saved_tensor_shapes`.
    """
    return {piece.get_dtype() for _, piece in _saved_slices(folder)}


def compare_state_shapes(saved: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], where,
                         compact: bool = False) -> None:
    """Raise ValueError naming missing, unexpected and mis-shaped tensors of a checkpoint.

    Args:
        saved: {name: shape} in the checkpoint. expected: {name: shape} of the model its config describes.
        where: the folder, Hub id or compact file (for the message). compact: `where` is a compact draft file.
    """
    _raise_for_keys(
        missing=sorted(set(expected) - set(saved)),
        unexpected=sorted(set(saved) - set(expected)),
        mismatched=sorted(k for k in set(saved) & set(expected) if tuple(saved[k]) != tuple(expected[k])),
        where=where, compact=compact,
    )


def check_saved_draft(folder: Path, model_cls) -> None:
    """Raise ValueError unless `folder` holds a complete draft: its config and tensors matching that config.

    Args:
        folder: a local draft folder. model_cls: the draft class (`LongSpecDraft`), built on the meta device from the
            folder's config to know the expected tensor names and shapes (no memory, no weights read).
    Raises: ValueError from `read_draft_config`, the config's own validation, `saved_tensor_shapes` or
        `compare_state_shapes`.
    """
    read_draft_config(folder)
    config = model_cls.config_class.from_pretrained(folder)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in model_cls(config).state_dict().items()}
    compare_state_shapes(saved_tensor_shapes(folder), expected, folder)


def check_loading_info(info: dict, where) -> None:
    """Raise ValueError if transformers' loading report lists missing, unexpected or mis-shaped tensors.

    Args:
        info: the dict `from_pretrained(..., output_loading_info=True)` returns.
        where: the folder or Hub id (for the message).
    """
    _raise_for_keys(*(sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")),
                    where=where)


def _raise_for_keys(missing: list, unexpected: list, mismatched: list, where, compact: bool = False) -> None:
    problems = [f"{label} {names[:4]}{' ...' if len(names) > 4 else ''}"
                for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", mismatched))
                if names]
    if problems:
        config, fix = ("its stored config", COMPACT_FIX) if compact else ("its config.json", _FIX)
        raise ValueError(
            f"the weights in {os.fspath(where)!r} do not match the draft {config} describes "
            f"({'; '.join(problems)}): a checkpoint of another model or a partial save; {fix}"
        )


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of floating-point parameters holding NaN or inf (a corrupted file or a diverged training run)."""
    return [n for n, p in model.named_parameters() if p.is_floating_point() and not bool(torch.isfinite(p).all())]


def check_finite_weights(model: torch.nn.Module, where, fix: str) -> None:
    """Raise ValueError naming the parameters of `model`, loaded from `where`, that hold NaN or inf, and `fix`."""
    broken = non_finite_parameters(model)
    if broken:
        raise ValueError(f"the draft weights in {os.fspath(where)!r} hold NaN or inf ({broken[:4]}): a corrupted file "
                         f"or a diverged training run; {fix}")


COMPACT_FORMAT = "longspec-draft-int8/1"  # safetensors metadata "format" of a compact draft file (int8 matrices)
COMPACT_FORMAT_INT4 = "longspec-draft-int4/1"  # the same with int4 matrices (groups of INT4_GROUP columns)
COMPACT_FORMATS = (COMPACT_FORMAT, COMPACT_FORMAT_INT4)
INT4_GROUP = 32  # columns sharing one int4 scale
INT4_CLIPS = tuple(1.0 - 0.05 * i for i in range(8))  # scale = clip x max|group| / 7, the clip of least error
_SCALE = ".int8_scale"  # suffix of the per-row scales of a weight stored as int8
_SCALE4 = ".int4_scale"  # suffix of the (rows, columns / INT4_GROUP) fp16 scales of a weight stored as packed int4


def _int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) float → int8 values and fp32 (rows,) scales, symmetric absmax per row."""
    scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


def _int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) fp32, cols a multiple of 2 x INT4_GROUP → (rows, cols / 2) uint8 (column 2j in the low nibble,
    2j + 1 in the high one, each value in -8 ... 7 stored + 8) and fp16 (rows, cols / INT4_GROUP) scales.

    Each group's scale is the one of `INT4_CLIPS` x max|group| / 7 (rounded to fp16) whose rounded group has the
    least squared error, so no group is worse than plain absmax rounding (clip 1.0)."""
    rows, cols = weight.shape
    groups = weight.view(rows, cols // INT4_GROUP, INT4_GROUP)
    peak = groups.abs().amax(dim=2, keepdim=True)
    best_values = best_scale = best_error = None
    for clip in INT4_CLIPS:
        scale = (peak * clip / 7).half().float().clamp(min=torch.finfo(torch.float16).tiny)
        values = torch.round(groups / scale).clamp(-8, 7)
        error = (values * scale - groups).square().sum(dim=2, keepdim=True)
        if best_error is None:
            best_values, best_scale, best_error = values, scale, error
        else:
            better = error < best_error
            best_values = torch.where(better, values, best_values)
            best_scale, best_error = torch.where(better, scale, best_scale), torch.minimum(error, best_error)
    stored = (best_values.view(rows, cols) + 8).to(torch.uint8)
    return stored[:, 0::2] | (stored[:, 1::2] << 4), best_scale.squeeze(2).half()


def _unpack_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `_int4`: (rows, cols / 2) uint8 and (rows, groups) fp16 scales → (rows, cols) fp32."""
    values = torch.stack([packed & 15, packed >> 4], dim=-1).view(packed.shape[0], -1).float() - 8
    return values * scale.float().repeat_interleave(INT4_GROUP, dim=1)


def write_compact_file(path, state: dict[str, torch.Tensor], config: dict, bits: int = 8) -> Path:
    """Save a draft's tensors and config as ONE safetensors file, its matrices in int8 (or int4).

    Every floating-point 2-D tensor (the draft's linear weights) is stored as int8 with one fp32 scale per row
    (symmetric absmax: w ≈ q · scale, |error| ≤ scale / 2 = max|row| / 254), or with `bits=4` as int4 in groups of
    `INT4_GROUP` columns of a row, two values per byte, one fp16 scale per group chosen for the least squared error
    (~9% relative error on a trained draft's matrices, against ~0.6% in int8; a matrix whose width is not a
    multiple of 2 x INT4_GROUP stays int8). Every other tensor (norm weights, the
    vocabulary's token ids) is kept as it is, floats in fp32 and int64 ids as int32. A draft of Qwen2.5-1.5B's width
    with a 1,536-wide MLP is ~20 MB in int8 (~40 MB in bf16), ~27 MB with three target layers read and ~15 MB of
    that in int4. Only the draft's proposals change with the rounding: the target verifies every token, so
    generation stays exact.

    Args:
        path: the file to write (a ".safetensors" name). state: the draft's `state_dict()`. config: its
            `config.to_dict()` (stored in the file's metadata). bits: 8 or 4.
    Returns: the path written.
    Raises: ValueError for bits other than 8 or 4.
    Reference: safetensors `save_file` (metadata); per-channel absmax int8 weight quantization (LLM.int8(),
        Dettmers et al. 2022, without outlier handling); group-wise int4 with a clipping search
        (round to nearest, as the GPTQ / AWQ storage formats; no calibration data).
    """
    from safetensors.torch import save_file

    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, got {bits!r}")
    tensors = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point() and tensor.dim() == 2:
            if bits == 4 and tensor.shape[1] % (2 * INT4_GROUP) == 0:
                tensors[name], tensors[name + _SCALE4] = _int4(tensor.float())
            else:
                tensors[name], tensors[name + _SCALE] = _int8(tensor.float())
        elif tensor.is_floating_point():
            tensors[name] = tensor.float()
        else:  # token ids (the draft vocabulary) fit int32: half the bytes
            tensors[name] = tensor.to(torch.int32) if tensor.dtype == torch.int64 else tensor
    path = _local_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path),
              metadata={"format": COMPACT_FORMAT if bits == 8 else COMPACT_FORMAT_INT4, "config": json.dumps(config)})
    return path


def compact_file_config(path) -> dict | None:
    """The draft config stored in a compact draft file (`write_compact_file`), or None when `path` is not a file.

    Raises: ValueError for a file that is not a compact LongSpec draft (another safetensors file, a truncated or
        foreign file), naming what to pass instead.
    """
    path = _local_path(path)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a compact LongSpec draft file (truncated or not a safetensors file: {err}); "
                         "pass a draft folder (save_pretrained) or a file written by draft.save_compact") from None
    if metadata.get("format") not in COMPACT_FORMATS or "config" not in metadata:
        raise ValueError(f"{path} is a safetensors file but not a compact LongSpec draft (format "
                         f"{metadata.get('format')!r}); pass the folder the draft was saved to (the one holding "
                         "config.json), or a file written by draft.save_compact")
    config = json.loads(metadata["config"])
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} holds a {config.get('model_type')!r} config, not a LongSpec draft; {COMPACT_FIX}")
    return config


def read_compact_state(path) -> dict[str, torch.Tensor]:
    """The tensors of a compact draft file, int8 and int4 matrices dequantized to fp32 (q · scale).

    Raises: ValueError for a file without the scales of an int8 or int4 tensor (a damaged file).
    """
    state = {}
    with safe_open(str(_local_path(path)), framework="pt") as f:
        names = set(f.keys())
        for name in names - {n for n in names if n.endswith((_SCALE, _SCALE4))}:
            tensor = f.get_tensor(name)
            if tensor.dtype in (torch.int8, torch.uint8):
                suffix = _SCALE if tensor.dtype == torch.int8 else _SCALE4
                if name + suffix not in names:
                    raise ValueError(f"{path}: {'int8' if suffix == _SCALE else 'int4'} tensor {name!r} has no scales "
                                     f"({name + suffix}); {COMPACT_FIX}")
                scale = f.get_tensor(name + suffix)
                tensor = tensor.float() * scale[:, None] if suffix == _SCALE else _unpack_int4(tensor, scale)
            elif tensor.dtype == torch.int32:
                tensor = tensor.long()
            state[name] = tensor
    return state


def create_hub_repo(repo_id: str, private: bool | None = None, token=None) -> str:
    """Create the Hub model repository `repo_id` if needed; return its full id ("owner/name").

    Reference: huggingface_hub `HfApi.create_repo`.
    """
    return HfApi(token=token).create_repo(repo_id, private=private, exist_ok=True).repo_id


def upload_draft_folder(folder, repo_id: str, commit_message: str | None = None, token=None,
                        revision: str | None = None, create_pr: bool = False) -> str:
    """Upload a saved draft folder, model card included, as one commit; return the commit URL.

    Reference: huggingface_hub `HfApi.upload_folder`.
    """
    commit = HfApi(token=token).upload_folder(repo_id=repo_id, folder_path=os.fspath(folder), revision=revision,
                                              create_pr=create_pr,
                                              commit_message=commit_message or "Upload LongSpec draft")
    return str(commit)


__all__ = [
    "local_draft_folder", "read_draft_config", "saved_tensor_shapes", "saved_tensor_dtypes", "compare_state_shapes",
    "check_saved_draft", "check_loading_info",
    "non_finite_parameters", "check_finite_weights", "create_hub_repo", "upload_draft_folder", "MODEL_TYPE",
    "WEIGHTS_NAME",
    "COMPACT_FORMAT", "COMPACT_FORMAT_INT4", "write_compact_file", "compact_file_config", "read_compact_state",
]
