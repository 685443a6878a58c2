"""Training documents found on the machine itself: the installed packages' code and docs, and the system's manuals.

Offline and real: every document is a file somebody wrote (or a package's README / docstrings), grouped by kind

    python      .py sources of every installed third-party package (round-robin over packages)
    c_cpp       C / C++ / CUDA sources and headers (.c .h .cc .cpp .hpp .cu .cuh ...), e.g. torch/include
    other_code  Rust, Go, JavaScript / TypeScript, shell, Fortran, Java, Julia ... where packages ship them
    docs        prose: .md / .rst / .txt shipped in packages, package READMEs (dist-info METADATA), the docstrings
                of Python modules joined per file, /usr/share/doc texts and man pages (roff stripped)
    prose       general text (.txt / .md: books, articles, essays) from folders the caller names, never the installed
                packages: they ship technical text alone (`benchmarks/build_prose.py` makes such a folder)

Evaluation material (`exclusions.py`) is skipped while scanning, and refused with a ValueError when asked for by
name or path. Files are deduplicated by content; order is shuffled per package and interleaved across packages so
that no single package dominates a kind.

Reference: LongSpec (arXiv 2502.17421) §4.1 (data of stages 1-2); DESIGN.md §5 (allowed training text).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import os
import random
import re
import site
import sys
import sysconfig
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .exclusions import evaluation_reason, name_reason, refuse_evaluation, text_evaluation_reason

__all__ = [
    "DOC_KINDS",
    "KIND_EXTENSIONS",
    "CorpusStats",
    "corpus_documents",
    "default_roots",
    "repository_documents",
    "roff_to_text",
]

KIND_EXTENSIONS = {
    "python": (".py",),
    "c_cpp": (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".inl", ".cu", ".cuh"),
    "other_code": (".rs", ".go", ".js", ".mjs", ".ts", ".sh", ".f90", ".f", ".java", ".jl", ".lua", ".pyx", ".pxd"),
    "docs": (".md", ".rst", ".txt"),
    "prose": (".txt", ".md"),
}
DOC_KINDS = tuple(KIND_EXTENSIONS)
_SKIP_DIRS = {"__pycache__", ".git", "node_modules", ".mypy_cache"}
_SKIP_DOC_NAMES = ("license", "copying", "notice", "authors", "copyright", "record", "top_level", "entry_points",
                   "requires", "sources", "dependency_links", "installer", "wheel", "requested")
_MAX_FILE_BYTES = 2_000_000  # generated tables, vendored amalgamations: not text anybody writes by hand


@dataclass
class CorpusStats:
    """What a scan read and skipped (filled in place by `corpus_documents`).

    Attributes: documents (yielded per kind), skipped_evaluation (files skipped as evaluation material, by reason),
        duplicates (identical files skipped), files_seen (candidate files listed).
    """

    documents: dict
    skipped_evaluation: dict
    duplicates: int = 0
    files_seen: int = 0

    @classmethod
    def empty(cls) -> CorpusStats:
        return cls(documents={}, skipped_evaluation={})


def default_roots() -> list[Path]:
    """The interpreter's site-/dist-packages folders (every installed third-party package lives under one)."""
    candidates = list(site.getsitepackages()) + [site.getusersitepackages()]
    candidates += [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    candidates += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    roots, seen = [], set()
    for c in candidates:
        path = Path(c)
        if path.is_dir() and path.resolve() not in seen:
            seen.add(path.resolve())
            roots.append(path)
    # a venv's base.pth may point at another site-packages (this repository's CPU setup does)
    for root in list(roots):
        for pth in root.glob("*.pth"):
            for line in pth.read_text(errors="ignore").splitlines():
                extra = Path(line.strip())
                if line.strip().endswith("site-packages") and extra.is_dir() and extra.resolve() not in seen:
                    seen.add(extra.resolve())
                    roots.append(extra)
    return roots


def _walk(root: Path, extensions: tuple[str, ...], stats: CorpusStats) -> Iterator[Path]:
    """Files under `root` whose lower-cased name ends with one of `extensions`, pruning evaluation material."""
    extensions = tuple(e.lower() for e in extensions)
    for folder, dirs, files in os.walk(root, followlinks=False):
        kept = []
        for d in sorted(dirs):
            if d in _SKIP_DIRS:
                continue
            reason = evaluation_reason(Path(folder, d))
            if reason is not None:
                stats.skipped_evaluation[reason] = stats.skipped_evaluation.get(reason, 0) + 1
                continue
            kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            if not name.lower().endswith(extensions):
                continue
            reason = name_reason(name)
            if reason is not None:
                stats.skipped_evaluation[reason] = stats.skipped_evaluation.get(reason, 0) + 1
                continue
            yield Path(folder, name)


def _group(path: Path, root: Path) -> str:
    """The top-level package (first folder under the root) a file belongs to, for round-robin interleaving."""
    rel = path.relative_to(root).parts
    return rel[0].split("-")[0].lower() if len(rel) > 1 else "_top"


def _interleave(groups: dict[str, list[Path]], seed: int) -> list[Path]:
    """Shuffle each group, then take one file from each group in turn (no package dominates the order)."""
    rng = random.Random(seed)
    lists = []
    for name in sorted(groups):
        files = list(groups[name])
        rng.shuffle(files)
        lists.append(files)
    rng.shuffle(lists)
    out = []
    for i in range(max((len(g) for g in lists), default=0)):
        out.extend(g[i] for g in lists if i < len(g))
    return out


def roff_to_text(source: str) -> str:
    """Plain text of a man page: roff requests dropped, font / escape sequences removed.

    Args:
        source: the roff source (e.g. a decompressed /usr/share/man/man1/*.1.gz).
    Returns: the text lines, section headings kept as plain lines.
    """
    lines = []
    for line in source.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if line.startswith((".SH", ".SS")):
            line = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
        elif line.startswith((".B ", ".I ", ".BR ", ".IR ", ".BI ", ".RB ", ".RI ", ".IB ")):
            line = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
        elif line.startswith((".", "'")):
            continue
        line = re.sub(r"\\f[BIRP1-4]|\\f\(..|\\f\[[^]]*\]|\\s[-+]?\d|\\&|\\\^|\\\||\\c|\\e", "", line)
        line = re.sub(r"\\\((..)", " ", line).replace("\\-", "-").replace("\\ ", " ").replace('"', "")
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _looks_like_prose(text: str, sample: int = 4000) -> bool:
    """True when at least 75% of the first `sample` characters are letters, spaces or common punctuation."""
    head = text[:sample]
    if not head:
        return False
    wordy = sum(c.isalpha() or c.isspace() or c in ".,;:'\"()-" for c in head)
    return wordy >= 0.75 * len(head)


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_STATEMENT_NODES = (ast.stmt, ast.excepthandler, ast.match_case)  # every node a definition can sit under


def _docstrings(source: str) -> str:
    """The module, class and function docstrings of a Python file, joined with their qualified names.

    Breadth first as `ast.walk`, in its order, but through statements only: a definition is never inside an
    expression, and the expressions are most of a file's nodes (a third of a corpus scan's time went on them).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    parts, queue = [], deque([tree])
    while queue:
        node = queue.popleft()
        queue.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, _STATEMENT_NODES))
        if isinstance(node, _DOCUMENTED):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 80:
                title = getattr(node, "name", "module")
                parts.append(f"{title}\n{'=' * len(title)}\n{doc}")
    return "\n\n".join(parts)


def _metadata_readme(text: str) -> str:
    """The long description (README) of a dist-info METADATA file: the body after the header block."""
    head, sep, body = text.partition("\n\n")
    return body if sep else ""


def _read(path: Path, kind: str) -> str | None:
    """A file's text for `kind` (man pages and .gz decompressed; docstrings for a .py read as docs)."""
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            return None
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    if kind != "docs":
        return text
    if path.suffix.lower() in (".txt", ".gz") and not _looks_like_prose(text):
        return None  # numeric tables and test data shipped as .txt
    if path.name == "METADATA":
        return _metadata_readme(text)
    if path.suffix == ".py":
        return _docstrings(text)
    if "man" in path.parts and re.search(r"\.\d\w*(\.gz)?$", path.name):
        return roff_to_text(text)
    return text


_SYSTEM_DOC_SUFFIXES = (".md", ".txt", ".rst", "readme", "readme.gz", ".txt.gz", "changelog.gz", "news.gz", ".md.gz")
_MAN_SUFFIXES = (".gz",) + tuple(f".{i}" for i in range(1, 9))


def _doc_files(roots: Sequence[Path], stats: CorpusStats, system_docs: bool) -> dict[str, list[Path]]:
    """Prose files grouped by package or folder.

    A root named `man` is read as man pages (English: its man1..man8 folders), a root named `doc` as system docs
    (READMEs, changelogs, .txt/.md; one group per package folder); any other root as installed packages: shipped
    .md/.rst/.txt, READMEs (dist-info METADATA) and docstrings of .py files. `system_docs` adds /usr/share/doc and
    /usr/share/man when they exist.
    """
    groups: dict[str, list[Path]] = {}
    extra = [Path("/usr/share/doc"), Path("/usr/share/man")] if system_docs else []
    for root in list(roots) + [r for r in extra if r.is_dir()]:
        if root.name == "man":
            for folder in sorted(root.glob("man[1-8]")):
                groups.setdefault(f"man:{folder.name}", []).extend(_walk(folder, _MAN_SUFFIXES, stats))
            continue
        system = root.name == "doc"
        for path in _walk(root, _SYSTEM_DOC_SUFFIXES if system else KIND_EXTENSIONS["docs"] + ("METADATA", ".py"),
                          stats):
            if path.name.lower().startswith(_SKIP_DOC_NAMES) and path.name != "METADATA":
                continue
            groups.setdefault(f"doc:{path.parent.name}" if system else _group(path, root), []).append(path)
    return groups


def _kind_files(kind: str, roots: Sequence[Path], stats: CorpusStats, system_docs: bool) -> dict[str, list[Path]]:
    if kind == "docs":
        return _doc_files(roots, stats, system_docs)
    groups: dict[str, list[Path]] = {}
    for root in roots:
        for path in _walk(root, KIND_EXTENSIONS[kind], stats):
            groups.setdefault(_group(path, root), []).append(path)
    return groups


def corpus_documents(kind: str, roots: Sequence[str | os.PathLike] | None = None, min_chars: int = 500,
                     max_chars: int | None = None, seed: int = 0, system_docs: bool = True,
                     stats: CorpusStats | None = None) -> Iterator[str]:
    """Yield the documents of one kind found under `roots`, lazily (stop consuming when you have enough).

    Args:
        kind: one of `DOC_KINDS` ("python", "c_cpp", "other_code", "docs", "prose").
        roots: folders to scan; None = `default_roots()` (the installed packages; not for "prose", which needs
            folders named here). Each root is checked against the evaluation material first.
        min_chars: skip documents shorter than this (characters); ~30000 for long (8k+ token) rows.
        max_chars: cut longer documents to this many characters (None = whole).
        seed: shuffling seed (per package, then interleaved across packages).
        system_docs: for "docs", also read /usr/share/doc and English man pages.
        stats: a `CorpusStats` to fill (documents yielded, evaluation files skipped, duplicates).
    Yields: str, one document each (UTF-8 files only; undecodable ones skipped).
    Raises: ValueError for an unknown kind, a root that is evaluation material or not a folder, or "prose" without
        roots.
    Reference: DESIGN.md §5; LongSpec §4.1.
    """
    stats, root_paths = _scan_setup(kind, roots, stats)
    files = _interleave(_kind_files(kind, root_paths, stats, system_docs), seed)
    stats.files_seen += len(files)
    seen_hashes: set[bytes] = set()
    for path in files:
        text = _read(path, kind)
        if text is None or len(text) < min_chars:
            continue
        reason = text_evaluation_reason(text)
        if reason is not None:
            stats.skipped_evaluation[reason] = stats.skipped_evaluation.get(reason, 0) + 1
            continue
        digest = hashlib.blake2b(text.encode("utf-8", "ignore"), digest_size=16).digest()
        if digest in seen_hashes:
            stats.duplicates += 1
            continue
        seen_hashes.add(digest)
        stats.documents[kind] = stats.documents.get(kind, 0) + 1
        yield text if max_chars is None else text[:max_chars]


def _scan_setup(kind: str, roots, stats: CorpusStats | None) -> tuple[CorpusStats, list[Path]]:
    """Check `kind` and the roots (existing folders, none of them evaluation material); the stats to fill."""
    if kind not in KIND_EXTENSIONS:
        raise ValueError(f"unknown document kind {kind!r}; choose from {DOC_KINDS}")
    if isinstance(roots, (str, bytes, os.PathLike)):
        raise ValueError(f"roots is a list of folders, got the single path {roots!r}: pass [{roots!r}]")
    if kind == "prose" and not roots:
        raise ValueError("the prose kind reads only folders you name (data.mix.prose_roots: folders of plain-text "
                         "books, articles or essays, e.g. made by benchmarks/build_prose.py); the installed packages "
                         "ship no general prose")
    root_paths = [Path(r) for r in roots] if roots is not None else default_roots()
    for root in root_paths:
        refuse_evaluation(root, "corpus root")
        if not root.is_dir():
            raise ValueError(f"corpus root {os.fspath(root)!r} is not a folder; give an existing folder to scan")
    return (stats if stats is not None else CorpusStats.empty()), root_paths


def repository_documents(kind: str, roots: Sequence[str | os.PathLike] | None = None, min_chars: int = 40_000,
                         max_chars: int = 140_000, per_package: int = 4, seed: int = 0, system_docs: bool = False,
                         stats: CorpusStats | None = None) -> Iterator[str]:
    """Yield long documents: neighbouring files of one package joined in path order, each under a file header (prose:
    none, the texts one after another).

    A repository-level view (what a long code-completion prompt looks like): files of the same folder follow each
    other, each preceded by `<comment> File: <relative path>`. Each long document starts at a random file of its
    package and takes the following files until it has `min_chars`; at most `per_package` documents per package, so
    the long rows cover many packages. A single file longer than `min_chars` is a long document by itself.

    Args:
        kind: one of `DOC_KINDS`.
        roots: folders to scan; None = `default_roots()` (not for "prose").
        min_chars: characters per document at least (~3.5 characters per token: 40,000 ~ 11k tokens).
        max_chars: cut documents to this many characters.
        per_package: long documents per package at most.
        seed: choice of packages and start files.
        system_docs: for "docs", also /usr/share/doc and man pages (one "package" per doc folder).
        stats: a `CorpusStats` to fill.
    Yields: str, one long document each.
    Raises: ValueError for an unknown kind, an evaluation-material root, or "prose" without roots.
    Reference: LongSpec §4.1 (stage 2: long documents, every token labelled).
    """
    stats, root_paths = _scan_setup(kind, roots, stats)
    groups = _kind_files(kind, root_paths, stats, system_docs)
    rng = random.Random(seed)
    names = sorted(groups)
    rng.shuffle(names)
    comment = "#" if kind in ("python", "docs") else "//"
    for name in names:
        files = sorted(groups[name])
        stats.files_seen += len(files)
        starts = rng.sample(range(len(files)), min(per_package, len(files)))
        for start in starts:
            parts, size = [], 0
            for path in files[start:]:
                text = _read(path, kind)
                if not text or text_evaluation_reason(text) is not None:
                    continue
                header = "" if kind == "prose" else f"{comment} File: {path.parent.name}/{path.name}\n"
                parts.append(header + text)  # prose: texts one after another, as in a book
                size += len(parts[-1])
                if size >= min_chars:
                    break
            if size >= min_chars:
                stats.documents[f"long_{kind}"] = stats.documents.get(f"long_{kind}", 0) + 1
                yield "\n\n".join(parts)[:max_chars]
