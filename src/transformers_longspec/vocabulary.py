"""The draft's vocabulary: the tokens a draft may propose, so that its LM head reads a fraction of the target's rows.

A draft shares the target's LM head, and at every tree level it multiplies its states by all of its rows only to keep
the best few candidates per node (Qwen2.5: 151,936 rows x 1,536 in bf16, 467 MB read per level, five levels per
step: most of the draft's time on an H200). Most rows are tokens the target almost never writes. A draft with
`config.draft_vocab_size = n` keeps the n token ids most frequent in its training data (`frequent_tokens`, stored as
its `draft_vocab` buffer); each call adds the prompt's own tokens that are not among them (up to `PROMPT_SLOTS`, the
most frequent first: the names and identifiers an output copies), and gathers the LM-head rows of that set once per
call into a buffer of fixed size, so one captured CUDA graph serves every call:

    ids:    [ n frequent tokens | the prompt's other tokens | padding (logit -inf) ]     (n + PROMPT_SLOTS,)
    weight: the LM-head rows of `ids`                                                     (n + PROMPT_SLOTS, hidden)

Lossless: only the draft's proposals change; the target verifies every node and chooses every emitted token. A token
outside the set is never proposed by the draft's beams (the retrieval branch may still carry it).

Reference: vocabulary-pruned draft heads (FR-Spec, Zhao et al. 2025; the draft vocabulary of EAGLE-3);
LongSpec (arXiv 2502.17421) §3.1 (the shared LM head).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

PROMPT_SLOTS = 4096  # slots for the prompt's own tokens beyond the draft's frequent set


class DraftVocabulary:
    """The token set one call's draft proposes from, with the LM-head rows of those tokens.

    Args:
        draft: an attached `LongSpecDraft` with `config.draft_vocab_size > 0`.
        frequent: how many of the draft's frequent tokens to keep, the most frequent first (1 ≤ frequent ≤
            `draft_vocab_size`); None keeps them all. Fewer rows make the LM head cheaper; the rest of the draft's
            tokens may still come in as the prompt's own.

    Tensors (on the draft's device, allocated once, refilled by `fill`): `ids` (size,) int64 token ids; `weight`
    (size, hidden) in the LM head's dtype; `bias` (size,) fp32, 0 for a token and -inf for a padding slot; size =
    `frequent + PROMPT_SLOTS`. `tokens`: how many slots hold a token after the last `fill`.

    Raises: ValueError if the draft has no vocabulary of its own (`draft_vocab_size == 0`) or `frequent` is out of
        range.
    Reference: module docstring.
    """

    def __init__(self, draft, frequent: int | None = None):
        if not draft.config.draft_vocab_size:
            raise ValueError("this draft proposes from the whole vocabulary (config.draft_vocab_size = 0); give it "
                             "one with draft.set_draft_vocabulary(frequent_tokens(...))")
        self.frequent = draft.config.draft_vocab_size if frequent is None else frequent
        if not 1 <= self.frequent <= draft.config.draft_vocab_size:
            raise ValueError(f"a draft vocabulary of {self.frequent} frequent tokens: this draft has "
                             f"{draft.config.draft_vocab_size}; use 1 to {draft.config.draft_vocab_size}")
        head = draft.shared_lm_head
        size = self.frequent + PROMPT_SLOTS
        self.ids = torch.zeros(size, dtype=torch.long, device=head.weight.device)
        self.weight = head.weight.new_zeros(size, head.weight.shape[1])
        self.bias = torch.zeros(size, dtype=torch.float32, device=head.weight.device)
        self.tokens = 0

    @classmethod
    def for_prompt(cls, draft, prompt: torch.Tensor, frequent: int | None = None) -> DraftVocabulary:
        """A vocabulary of `frequent` tokens (see the class) allocated and filled for `prompt` (prompt_len,) int64
        (see `fill`)."""
        vocab = cls(draft, frequent)
        vocab.fill(draft, prompt)
        return vocab

    def fill(self, draft, prompt: torch.Tensor) -> int:
        """Set the vocabulary for a call on `prompt` (prompt_len,) int64: the draft's frequent tokens, then the
        prompt's other tokens (most frequent first, at most `PROMPT_SLOTS`), then padding. Reads a few values on the
        host (not inside a captured step). Returns: the number of prompt tokens added.
        Raises: ValueError if the draft's stored vocabulary repeats a token."""
        frequent = draft.draft_vocab
        if torch.unique(frequent).numel() != frequent.numel():  # siblings must stay distinct (sampling's rule)
            raise ValueError("the draft's vocabulary (draft_vocab) repeats token ids: a corrupted file; set it again "
                             "with draft.set_draft_vocabulary(ids)")
        frequent = frequent[: self.frequent]
        known = torch.zeros(draft.config.vocab_size, dtype=torch.bool, device=frequent.device)
        known[frequent] = True
        prompt = prompt.to(frequent.device)
        others, counts = torch.unique(prompt[~known[prompt]], return_counts=True)
        others = others[counts.argsort(descending=True, stable=True)[:PROMPT_SLOTS]]
        n, m = frequent.numel(), others.numel()
        self.ids.zero_()
        self.ids[:n], self.ids[n : n + m] = frequent, others
        self.bias.fill_(float("-inf"))
        self.bias[: n + m] = 0.0
        self.weight.copy_(draft.shared_lm_head.weight[self.ids])
        self.tokens = n + m
        return m

    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(t.numel() * t.element_size() for t in (self.ids, self.weight, self.bias))


def frequent_tokens(rows: Iterable, size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent token ids in training rows (ties: the smaller id first), for `set_draft_vocabulary`.

    Args:
        rows: token sequences: lists of ints, 1-D int64 tensors, or dicts with an "input_ids" entry (the rows of
            `trainers.mix.build_mix` and `trainers.data.pack_texts`).
        size: tokens to keep. vocab_size: the target's vocabulary size (ids must be below it).
    Returns: (size,) int64, sorted by decreasing count.
    Raises: ValueError if `size` is not in [1, vocab_size) or the rows hold fewer than `size` distinct tokens.
    Reference: FR-Spec (Zhao et al. 2025), frequency-ranked draft vocabulary.
    """
    if not 0 < size < vocab_size:
        raise ValueError(f"a draft vocabulary needs 0 < size < vocab_size={vocab_size}, got {size}")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in rows:
        ids = row["input_ids"] if isinstance(row, dict) else row
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        counts += torch.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size)
    seen = int((counts > 0).sum())
    if seen < size:
        raise ValueError(f"the training rows hold {seen} distinct tokens, fewer than draft_vocab_size={size}: use a "
                         "smaller size or more data")
    return torch.sort(counts, descending=True, stable=True).indices[:size]


__all__ = ["DraftVocabulary", "PROMPT_SLOTS", "frequent_tokens"]
