"""The project's evaluation material, recognised by path and by content, so that no draft is ever trained on it.

Evaluation sets (DESIGN.md §5): the CPython standard library (code completion), State of the Union addresses
(summaries), CHAMP (math), the Debian Policy Manual and llama.cpp / ggml sources (held-out long documents), and
the project's own jsonl sets (`data/eval/`, `.evaldata/`). Two entry points:

    evaluation_reason(path)        -> str | None   why a file is evaluation material (scanners skip it)
    refuse_evaluation(path, what)  -> None         raise ValueError when a user ASKS for it (a root, a jsonl, ...)
    text_evaluation_reason(text)   -> str | None   markers inside a document (a copy renamed or nested elsewhere)

Reference: DESIGN.md §5 (what we may train on); LongSpec (arXiv 2502.17421) §4.1.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

__all__ = [
    "EXCLUDED_PACKAGES",
    "evaluation_reason",
    "is_package_allowed",
    "name_reason",
    "refuse_evaluation",
    "refuse_package",
    "text_evaluation_reason",
]

# Top-level import names whose sources are evaluation material (gguf-py lives in the llama.cpp repository).
EXCLUDED_PACKAGES = ("gguf", "llama_cpp", "ggml")

# (substring of a lower-cased path component, reason)
_PATH_RULES = (
    ("llama.cpp", "llama.cpp / ggml sources"),
    ("llama_cpp", "llama.cpp / ggml sources"),
    ("llama-cpp", "llama.cpp / ggml sources"),
    ("ggml", "llama.cpp / ggml sources"),
    ("gguf", "llama.cpp / ggml sources"),
    ("debian-policy", "the Debian Policy Manual"),
    ("debian_policy", "the Debian Policy Manual"),
    ("state_union", "State of the Union addresses"),
    ("state-union", "State of the Union addresses"),
    ("state_of_the_union", "State of the Union addresses"),
    ("state-of-the-union", "State of the Union addresses"),
    ("stateoftheunion", "State of the Union addresses"),
    ("sotu", "State of the Union addresses"),
)
# lower-cased path components that are evaluation material as a whole
_EXACT_PARTS = {"champ": "CHAMP competition problems", ".evaldata": "the project's evaluation sets"}
# phrases that mark a document as evaluation material wherever it sits (checked on the first 20,000 characters)
_TEXT_MARKERS = (
    ("debian policy manual", "the Debian Policy Manual"),
    ("state of the union", "State of the Union addresses"),
    ("ggml_", "llama.cpp / ggml sources"),
    ("llama.cpp", "llama.cpp / ggml sources"),
)
_MARKER_CHARS = 20_000


@lru_cache(maxsize=1)
def _stdlib_roots() -> tuple[Path, ...]:
    """The interpreter's standard-library folders (their site-/dist-packages are third-party, hence allowed)."""
    paths = sysconfig.get_paths()
    roots = {Path(paths[key]).resolve() for key in ("stdlib", "platstdlib") if paths.get(key)}
    roots |= {Path(sys.base_prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}").resolve()}
    return tuple(sorted(roots))


def _is_cpython(parts: tuple[str, ...], resolved: Path) -> bool:
    """True under a standard-library folder (outside site-/dist-packages) or in CPython's own docs / man pages."""
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    if any(resolved.is_relative_to(root) for root in _stdlib_roots()):
        return True
    lowered = [p.lower() for p in parts]
    if "doc" in lowered:  # /usr/share/doc/python3.12, python3-doc, libpython3.12 ...: the CPython documentation
        tail = lowered[lowered.index("doc") + 1 :]
        if tail and (tail[0].startswith(("python3", "python2", "libpython", "cpython")) or tail[0] == "python"):
            return True
    name = lowered[-1] if lowered else ""
    return "man" in lowered and name.startswith(("python", "pydoc", "idle"))


def evaluation_reason(path: str | os.PathLike) -> str | None:
    """Why `path` is evaluation material, or None when it may be trained on.

    Args:
        path: a file or folder.
    Returns: a short reason ("the CPython standard library", "the Debian Policy Manual", ...) or None.
    Reference: DESIGN.md §5.
    """
    resolved = Path(path).resolve()
    parts = resolved.parts
    if _is_cpython(parts, resolved):
        return "the CPython standard library"
    for part in parts:
        reason = name_reason(part)
        if reason is not None:
            return reason
    for i in range(len(parts) - 1):
        if parts[i] == "data" and parts[i + 1] == "eval":
            return "the project's evaluation sets (data/eval)"
    return None


def name_reason(name: str) -> str | None:
    """Why one file or folder NAME (not a whole path) marks evaluation material, or None (cheap: no file system)."""
    low = name.lower()
    if low in _EXACT_PARTS:
        return _EXACT_PARTS[low]
    for needle, reason in _PATH_RULES:
        if needle in low:
            return reason
    return None


def text_evaluation_reason(text: str) -> str | None:
    """Why a document's text looks like evaluation material (markers in its first 20,000 characters), or None."""
    head = text[:_MARKER_CHARS].lower()
    for marker, reason in _TEXT_MARKERS:
        if marker in head:
            return reason
    return None


def refuse_evaluation(path: str | os.PathLike, what: str = "training data") -> None:
    """Raise ValueError if `path` (or a folder above it) is evaluation material.

    Args:
        path: what the user asked to train on (a folder to scan, a jsonl file, ...).
        what: how the message names it, e.g. "data.mix.roots".
    Raises: ValueError naming the material and the fix.
    Reference: DESIGN.md §5.
    """
    reason = evaluation_reason(path)
    if reason is not None:
        raise ValueError(
            f"{what} {os.fspath(path)!r} is {reason}, which is evaluation material: never train on it. Pick other "
            "packages, folders or files (installed third-party packages, their docs, your own jsonl)"
        )


def is_package_allowed(name: str) -> bool:
    """False for standard-library module names and llama.cpp-derived packages."""
    top = name.split(".")[0]
    return top not in sys.stdlib_module_names and top not in EXCLUDED_PACKAGES


def refuse_package(name: str) -> None:
    """Raise ValueError for a standard-library or llama.cpp-derived package name.

    Raises: ValueError naming the material and the fix.
    """
    top = name.split(".")[0]
    if top in sys.stdlib_module_names:
        raise ValueError(
            f"'{name}' is part of the Python standard library, which is evaluation material; "
            "train on third-party packages instead (e.g. torch, transformers, numpy)"
        )
    if top in EXCLUDED_PACKAGES:
        raise ValueError(f"'{name}' comes from llama.cpp/ggml, which is evaluation material; pick another package")
