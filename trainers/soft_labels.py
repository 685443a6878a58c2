"""Soft distillation: train the draft on the target's top-k next-token distribution, not only its argmax.

A tree draft proposes several children per node; a child is accepted when it equals the target's argmax, so the
draft's SECOND and third choices matter as much as its first. The argmax label says nothing about them; the
target's top-k distribution does. Per supervised position t (predicting token t + 1):

    p_k   = softmax of the target's k largest logits at t           (renormalised over those k tokens)
    loss  = - sum_{i in top-k} p_k(i) * log q(i)                    q = the draft's full softmax at t
          = KL(p_k || q) + H(p_k)                                    (H(p_k) does not depend on the draft)

mixed with the hard cross-entropy as (1 - w) * CE + w * soft (`soft_labels_weight`). The target's top-k come from
the same LM-head pass that gives the argmax labels (`target_topk`), in chunks; the draft's loss for both terms is
one `sparse_cross_entropy` per chunk (the k + 1 ids and their weights, fused through the logits' LSE), so one chunk
of (batch, chunk, vocab) fp32 logits is alive at a time. With `draft_vocab_loss` q is the softmax over the draft's
vocabulary and the batch's tokens only (`draft_vocab_loss_parts`, `vocabulary_targets`), near the set `generate`
proposes from (the vocabulary and the prompt's tokens).

Reference: Hinton et al. 2015 (knowledge distillation); DistillSpec (Zhou et al., 2023, speculative drafts
distilled on the target's distribution); LongSpec (arXiv 2502.17421) §3.2 (the draft's next-token loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .sparse_cross_entropy import sparse_cross_entropy

__all__ = ["draft_vocab_loss_parts", "require_draft_vocabulary", "soft_distill_loss", "target_topk",
           "vocabulary_targets"]


def target_topk(target, hidden: torch.Tensor, k: int, chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's k most likely next tokens at every position, from its final hidden states.

    Args:
        target: the target `*ForCausalLM` (its `lm_head`).
        hidden: (batch, seq, hidden) final normed hidden states (`target_last_layer_kv(return_hidden=True)`).
        k: tokens kept per position (>= 1; the first is the argmax).
        chunk: positions per LM-head call.
    Returns: (logits (batch, seq, k) fp32, ids (batch, seq, k) int64), sorted by decreasing logit; position t
        describes the token after t.
    Raises: ValueError if `k` < 1 or larger than the vocabulary.
    Reference: knowledge distillation on top-k logits.
    """
    vocab = target.get_output_embeddings().weight.shape[0]
    if not 1 <= k <= vocab:
        raise ValueError(f"soft_labels_topk must be in [1, vocab={vocab}], got {k}")
    batch, seq, _ = hidden.shape
    values = torch.empty(batch, seq, k, dtype=torch.float32, device=hidden.device)
    ids = torch.empty(batch, seq, k, dtype=torch.long, device=hidden.device)
    with torch.no_grad():
        for start in range(0, seq, chunk):
            top = target.lm_head(hidden[:, start : start + chunk]).topk(k, dim=-1)  # in the target's dtype
            values[:, start : start + chunk], ids[:, start : start + chunk] = top.values.float(), top.indices
    return values, ids


def soft_distill_loss(lm_logits, hidden: torch.Tensor, top_logits: torch.Tensor | None,
                      top_ids: torch.Tensor | None, labels: torch.Tensor, noise_offset: int = 1, chunk: int = 2048,
                      soft_weight: float = 1.0) -> torch.Tensor:
    """Mean soft cross-entropy of the draft against the target's top-k over the supervised positions, mixed with the
    hard cross-entropy on `labels`: w * soft + (1 - w) * hard, both from one LM-head pass per chunk.

    Positions follow `LongSpecDraft.forward`'s hard loss: position t is supervised when `labels[:, t + 1]` != -100
    and t >= `noise_offset` (the first j positions see no target K/V under flash noisy training), so the mix equals
    (1 - w) * `LongSpecDraft.forward(labels=labels).loss` + w * the soft loss alone, at half the LM-head work.

    Args:
        lm_logits: the draft's `lm_logits` (normed states → fp32 logits over the vocabulary).
        hidden: (batch, seq, hidden) the draft's normed output states (`LongSpecDraftOutput.hidden_states`).
        top_logits, top_ids: (batch, seq, k) from `target_topk`, for the same tokens; both None for the hard loss
            alone (`soft_weight` is then ignored).
        labels: (batch, seq) int64, unshifted (-100 = not supervised), as given to the draft; position t's hard label
            is `labels[:, t + 1]`.
        noise_offset: j of flash noisy training (>= 1).
        chunk: positions per LM-head chunk.
        soft_weight: w in [0, 1] (1 = soft only).
    Returns: () fp32 loss (0, still in the graph, when nothing is supervised).
    Raises: ValueError if shapes disagree, only one of top_logits / top_ids is given, or a label is negative other
        than -100 (torch's gather raises for one >= the vocabulary).
    Reference: knowledge distillation (Hinton et al., 2015); LongSpec §3.2, Alg. 2 (dropped queries).
    """
    if (top_logits is None) != (top_ids is None):
        raise ValueError("soft_distill_loss takes top_logits and top_ids together (both None: the hard loss alone)")
    if labels.shape != hidden.shape[:2]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} must share (batch, seq)")
    bad = (labels < 0) & (labels != -100)
    if bool(bad.any()):
        raise ValueError(f"labels must be token ids or -100 (not supervised), got {labels[bad][0].item()}")
    if top_logits is None:  # the hard loss alone: no top-k columns, weight 1 on the label
        top_logits = hidden.new_empty(*hidden.shape[:2], 0, dtype=torch.float32)
        top_ids = torch.empty(*hidden.shape[:2], 0, dtype=torch.long, device=hidden.device)
        soft_weight = 0.0
    if top_ids.shape != top_logits.shape or top_ids.shape[:2] != hidden.shape[:2]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and top-k {tuple(top_logits.shape)} / "
                         f"{tuple(top_ids.shape)} must share (batch, seq)")
    mask = torch.zeros(labels.shape, dtype=torch.bool, device=labels.device)
    mask[:, :-1] = labels[:, 1:] != -100
    mask[:, :noise_offset] = False
    total = hidden.float().sum() * 0.0
    for start in range(0, hidden.shape[1] - 1, chunk):
        end = min(start + chunk, hidden.shape[1] - 1)
        part = mask[:, start:end, None]
        if not part.any():
            continue
        soft = torch.softmax(top_logits[:, start:end].float(), dim=-1) * soft_weight
        hard = labels[:, start + 1 : end + 1, None].clamp(min=0)
        ids = torch.cat([top_ids[:, start:end], hard], dim=-1)
        weights = torch.cat([soft, torch.full(hard.shape, 1.0 - soft_weight, device=soft.device)], dim=-1) * part
        total = total + sparse_cross_entropy(lm_logits, hidden[:, start:end], ids, weights)
    return total / mask.sum().clamp(min=1)


def vocabulary_targets(kept: torch.Tensor, vocab_size: int, top_logits: torch.Tensor, top_ids: torch.Tensor,
                       labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss targets of `soft_distill_loss` moved onto the slots of a draft vocabulary (`draft_vocab_loss`).

    Args:
        kept: (m,) int64, distinct token ids the loss's softmax runs over (slot i = kept[i]).
        vocab_size: the target's vocabulary size.
        top_logits, top_ids: (batch, seq, k) from `target_topk`.
        labels: (batch, seq) int64 token ids, unshifted, -100 = not supervised.
    Returns: (top_logits with -inf where the id is not kept, so the soft target renormalises over the kept ids;
        top_ids as slots (0 where not kept: weight 0); labels as slots, -100 where the token is not kept or the
        position's top-k holds no kept id, whose logits are left finite). Shapes and dtypes as given.
    Reference: vocabulary-pruned draft heads (FR-Spec, Zhao et al. 2025); `vocabulary.py`.
    """
    slots = torch.full((vocab_size,), -1, dtype=torch.long, device=kept.device)
    slots[kept] = torch.arange(kept.numel(), device=kept.device)
    top_slots = slots[top_ids]
    none_kept = ~(top_slots >= 0).any(-1)  # (batch, seq): unsupervised below; its logits stay finite (no NaN)
    label_slots = torch.where(labels >= 0, slots[labels.clamp(min=0)], -1)
    label_slots[:, 1:] = label_slots[:, 1:].masked_fill(none_kept[:, :-1], -1)  # position t predicts token t + 1
    top_logits = top_logits.masked_fill((top_slots < 0) & ~none_kept[..., None], float("-inf"))
    return top_logits, top_slots.clamp(min=0), label_slots.masked_fill(label_slots < 0, -100)


def require_draft_vocabulary(draft) -> None:
    """Raise ValueError unless `draft` has a vocabulary of its own (`config.draft_vocab_size` > 0), which
    `draft_vocab_loss` needs."""
    if not draft.config.draft_vocab_size:
        raise ValueError("draft_vocab_loss=True needs a draft with a vocabulary of its own: "
                         "draft.set_draft_vocabulary(frequent_tokens(rows, n)) first (or the recipe's "
                         "draft_vocab_size), or leave draft_vocab_loss off")


def draft_vocab_loss_parts(draft, input_ids: torch.Tensor, top_logits: torch.Tensor, top_ids: torch.Tensor,
                           labels: torch.Tensor):
    """`draft_vocab_loss`: an LM head over the draft's frequent tokens and the batch's own tokens (what `generate`
    proposes from: the draft's vocabulary and the prompt's tokens), and the targets moved onto its slots.

    Args:
        draft: a `LongSpecDraft` with a vocabulary (`config.draft_vocab_size` > 0), attached to its target.
        input_ids: (batch, seq) int64, the batch. top_logits, top_ids, labels: as `vocabulary_targets`.
    Returns: (lm_logits: normed states (..., hidden) → fp32 logits over the m kept tokens, (top_logits, top_ids,
        labels) from `vocabulary_targets`), ready for `soft_distill_loss`.
    Raises: ValueError if the draft has no vocabulary of its own.
    Reference: `vocabulary.DraftVocabulary`: at inference the set is the vocabulary plus up to 4,096 of the prompt's
        tokens; here it is the vocabulary plus every token of the batch (all rows, the supervised ones included), so
        the loss of a row depends on the rows it is batched with.
    """
    require_draft_vocabulary(draft)
    head = draft.shared_lm_head
    kept = torch.unique(torch.cat([draft.draft_vocab.to(input_ids.device), input_ids.flatten()]))
    weight = head.weight[kept]
    bias = None if getattr(head, "bias", None) is None else head.bias[kept]

    def lm_logits(states: torch.Tensor) -> torch.Tensor:
        return F.linear(states.to(weight.dtype), weight, bias).float()

    return lm_logits, vocabulary_targets(kept, head.weight.shape[0], top_logits, top_ids, labels)
