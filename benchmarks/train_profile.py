"""Where a draft training step's time goes (GPU; random weights of Qwen2.5-1.5B's shape, no data needed).

    python benchmarks/train_profile.py --out train_profile.json

One step of `LongSpecTrainer.compute_loss` + backward + AdamW, as the mixed recipe runs it (bf16 autocast, fp32 draft
weights, the draft reading the target's hidden state, argmax labels + top-16 soft labels, flash noise j = 2), split
by CUDA events into: the frozen target's decoder pass, its LM head top-k, the draft's forward, the loss (LM-head
chunks), the backward and the optimizer step. Two batch layouts of 16,384 tokens: 16 short rows of 1,024
(anchor-offset positions) and one long row, of tokens drawn from a random draft vocabulary of 32,768; each again with
the loss over that vocabulary (`draft_vocab_loss`); then the short rows with four noise offsets on the one target pass
(`noise_offsets_per_step`). Prints ms per phase, tokens per second and peak memory; the mean of 5 steps after 2
warm-up steps.
"""

from __future__ import annotations

import argparse
import json

import torch
from step_profile import random_target

from transformers_longspec import LongSpecDraft
from transformers_longspec.trainers import target_last_layer_kv
from transformers_longspec.trainers.soft_labels import draft_vocab_loss_parts, soft_distill_loss, target_topk

PHASES = ("target", "target_topk", "draft_forward", "loss", "backward", "optimizer")


def one_step(target, draft, optimizer, ids, positions, marks, vocab_loss: bool = False, offsets: int = 1) -> None:
    """compute_loss + backward + optimizer step, with a CUDA event after each phase appended to `marks`;
    `vocab_loss`: the loss over the draft's vocabulary + the batch's tokens (`draft_vocab_loss`); `offsets`: noise
    offsets 2, 1, 3, 4 ... trained on the one target pass (`noise_offsets_per_step`), the loss their mean."""
    def mark():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        marks.append(event)

    mark()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        keys, values, hidden = target_last_layer_kv(target, ids, positions, return_hidden=True)
        mark()
        top_logits, top_ids = target_topk(target, hidden, 16)
        labels = torch.full_like(ids, -100)
        labels[:, 1:] = top_ids[:, :-1, 0]
        mark()
        noises = (2, 1, 3, 4)[:offsets]
        outs = [draft(input_ids=ids, target_keys=keys, target_values=values, position_ids=positions,
                      noise_offset=j, target_hidden=hidden) for j in noises]
        mark()
        lm_logits, targets = draft.lm_logits, (top_logits, top_ids, labels)
        if vocab_loss:
            lm_logits, targets = draft_vocab_loss_parts(draft, ids, *targets)
        loss = sum(soft_distill_loss(lm_logits, out.hidden_states, *targets, j, 512, 0.5)
                   for j, out in zip(noises, outs)) / len(noises)
    mark()
    loss.backward()
    mark()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark()


def profile(target, draft, rows: int, seq: int, steps: int = 5, warm_up: int = 2, vocab_loss: bool = False,
            offsets: int = 1) -> dict:
    """Mean ms per phase over `steps` steps of a (rows, seq) batch; positions 0.. (long) or offset (short rows)."""
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    # tokens of the draft's vocabulary (real rows are mostly its frequent tokens), so the loss over the vocabulary
    # and the batch's tokens runs over its 32,768 rows
    vocab = draft.draft_vocab
    ids = vocab[torch.randint(0, vocab.numel(), (rows, seq), device="cuda", generator=g)]
    torch.cuda.reset_peak_memory_stats()
    offset = 0 if rows == 1 else 8192  # anchor-offset: short rows sit at large positions
    positions = (torch.arange(seq, device="cuda") + offset).expand(rows, seq)
    totals = dict.fromkeys(PHASES, 0.0)
    for step in range(warm_up + steps):
        marks = []
        one_step(target, draft, optimizer, ids, positions, marks, vocab_loss, offsets)
        torch.cuda.synchronize()
        if step >= warm_up:
            for name, a, b in zip(PHASES, marks, marks[1:]):
                totals[name] += a.elapsed_time(b) / steps
    step_ms = sum(totals.values())
    return {"rows": rows, "seq": seq, "draft_vocab_loss": vocab_loss, "offsets": offsets, "ms": totals,
            "step_ms": step_ms,
            "tokens_per_s": rows * seq / step_ms * 1e3, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="train_profile.json")
    args = parser.parse_args()
    target = random_target("qwen2.5-1.5b").requires_grad_(False)
    draft = LongSpecDraft.from_target(target, target_hidden_input=True).to(device="cuda", dtype=torch.float32)
    draft.train()
    draft.set_draft_vocabulary(torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(0))
                               [:32768].cuda())
    rows = [profile(target, draft, 16, 1024), profile(target, draft, 1, 16384)]
    # the same with the loss over the draft's vocabulary + the batch's tokens (`draft_vocab_loss`)
    rows += [profile(target, draft, 16, 1024, vocab_loss=True), profile(target, draft, 1, 16384, vocab_loss=True)]
    # every tree level on one target pass (`noise_offsets_per_step` 4)
    rows += [profile(target, draft, 16, 1024, offsets=4), profile(target, draft, 16, 1024, vocab_loss=True, offsets=4)]
    for row in rows:
        phases = " + ".join(f"{name} {ms:.0f}" for name, ms in row["ms"].items())
        print(f"{row['rows']} x {row['seq']}{' draft_vocab_loss' if row['draft_vocab_loss'] else ''}"
              f"{' offsets ' + str(row['offsets']) if row['offsets'] > 1 else ''}: "
              f"{row['step_ms']:.0f} ms/step = {phases} ms; "
              f"{row['tokens_per_s']:.0f} tokens/s, peak {row['peak_gib']:.1f} GiB")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
