"""Teacher-forced acceptance: several drafts on the same fixed target texts, with no decoding and no near-tie noise.

`tau_matrix.py` measures τ by decoding, so in bf16 each run may part from the plain text at a near-tie and then
measures another text: the int8 and int4 copies of one draft, equal here to within 0.03 chain τ, differed by 0.2-1.1
τ on its two-prompt summary cells (benchmarks/NOTES.md, session 25). Here the target's greedy answer to each prompt
is generated once (or read back with `--answers`), one target pass covers prompt + answer, and every draft runs its
training forward over it at noise offsets 1..depth: level k of a draft chain reads the target's cache up to the last
committed token and k - 1 true tokens after it, which is offset j = k (LongSpec §3.2, Alg. 2;
`LongSpecDraft.forward`). Per answer position t and level k, the draft's top choice (over its vocabulary for this
prompt, `DraftVocabulary`, as at inference) is compared with the target's token t + k. From these:

- `level_accuracy[k]`: how often level k alone is right (teacher-forced, not conditioned on the levels before);
- `first_top1`, `first_topw`: the first token among the draft's best 1 / `--width` (the default tree's root width);
- `first_top1_in_prompt` / `first_top1_new`: the same for answer tokens that occur in the prompt / that do not;
- `chain_tau`: the chain tree `[1] * depth` decoded on the fixed text (from each step's bonus token the run of
  right levels, then the next bonus): the accepted lengths `generate` records with that chain in exact arithmetic;
- `chain_retrieval_tau`: the same step by step with the retrieval chain beside it (`--retrieval` tokens after the
  longest earlier match, `retrieval.retrieval_accepted`), the longer of the two accepted.

    python benchmarks/accept_matrix.py --target ~/qwen15 --drafts s19=draft-s19.int8.safetensors,s25=... \\
        --datasets heldout:4,code_completion,summarization --buckets 8192,16384,30000 --out accept.json
    python benchmarks/accept_matrix.py ... --answers accept.json   # the same texts again (another machine, drafts)

Output: JSON {"meta", "rows"} (a row per prompt: its answer ids and one record per draft; rewritten after every
prompt) and a markdown table beside it (per dataset x bucket x draft, the mean over the prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from transformers_longspec.cli.models import load_draft, load_target
from transformers_longspec.demo import eval_prompt
from transformers_longspec.retrieval import retrieval_accepted, validate_retrieval_tokens
from transformers_longspec.trainers.trainer import target_last_layer_kv
from transformers_longspec.vocabulary import DraftVocabulary

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script, also when imported by path
from tau_matrix import add_prompt_arguments, prompt_rows  # noqa: E402


def target_pass(target, sequence: torch.Tensor, feature_layers) -> tuple:
    """The target's last-layer K/V and hidden input for a draft (final states, then `feature_layers`' outputs) over
    `sequence` (1, length) int64 at positions 0..length-1. Returns (keys, values, hidden)."""
    positions = torch.arange(sequence.shape[1], device=sequence.device)[None]
    return target_last_layer_kv(target, sequence, positions, return_hidden=True, feature_layers=feature_layers or ())


@torch.no_grad()
def level_choices(draft, sequence: torch.Tensor, prompt_len: int, depth: int, width: int, passed) -> torch.Tensor:
    """The draft's best `width` tokens at each level on the fixed text.

    Args:
        draft: an attached `LongSpecDraft`. sequence: (1, length) int64, prompt + the target's greedy answer.
        prompt_len: tokens of the prompt (the answer's first token, from the prefill, sits at this position).
        depth: levels (noise offsets 1..depth). width: choices kept per level.
        passed: `target_pass(target, sequence, draft.config.target_feature_layers)`.
    Returns: (depth, length, width) int64: [k - 1, s] holds the level-k choices made at position s, i.e. the
        proposals for token s + 1 when the last committed token is s - k + 1 (rows s < prompt_len unused: the
        first draft step starts at the prefill's token).
    """
    keys, values, hidden = passed
    vocab = DraftVocabulary.for_prompt(draft, sequence[0, :prompt_len]) if draft.config.draft_vocab_size else None
    length = sequence.shape[1]
    choices = sequence.new_zeros(depth, length, width)
    for k in range(1, depth + 1):
        states = draft(input_ids=sequence, target_keys=keys, target_values=values, noise_offset=k,
                       target_hidden=hidden if draft.config.target_hidden_input else None).hidden_states
        states = states[0, prompt_len:]
        if vocab is None:
            logits = draft.lm_logits(states)
            choices[k - 1, prompt_len:] = logits.topk(width, dim=-1).indices
        else:
            logits = F.linear(states.to(vocab.weight.dtype), vocab.weight).float() + vocab.bias
            choices[k - 1, prompt_len:] = vocab.ids[logits.topk(width, dim=-1).indices]
    return choices


def level_hits(choices: torch.Tensor, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(depth, length) bool on the CPU: [k - 1, t] is True where level k's top choice, from the bonus token at t
    (prompt_len <= t < length - k), is the target's token t + k; False elsewhere."""
    choices, tokens = choices.cpu(), sequence[0].cpu()
    length, depth = tokens.shape[0], choices.shape[0]
    hits = torch.zeros(depth, length, dtype=torch.bool)
    for k in range(1, depth + 1):
        starts = torch.arange(prompt_len, length - k)
        hits[k - 1, starts] = choices[k - 1, starts + k - 1, 0] == tokens[starts + k]
    return hits


def chain_accepted(choices: torch.Tensor, sequence: torch.Tensor, prompt_len: int) -> list[int]:
    """Draft tokens a chain accepts from each bonus position t (prompt_len <= t < length - 1): the run of levels
    k = 1.. whose top choice at position t + k - 1 equals token t + k (stopping at the text's end)."""
    return level_hits(choices, sequence, prompt_len).long().cumprod(dim=0).sum(dim=0).tolist()


def decode_steps(sequence: torch.Tensor, prompt_len: int, accepted: list[int], retrieval: int = 0) -> list[int]:
    """The tokens each step emits when decoding the fixed text (accepted draft tokens + the bonus; the prefill's
    token is not a step), as `LongSpecStats.accepted_lengths` records them. With `retrieval` > 0 a retrieval chain
    of that many tokens is verified beside the draft's: the step keeps the longer accepted run."""
    tokens, length = sequence[0], sequence.shape[1]
    steps, t = [], prompt_len
    while t < length - 1:
        a = accepted[t]
        if retrieval:
            a = max(a, int(retrieval_accepted(tokens, t, retrieval)))
        a = min(a, length - 1 - t - 1)  # the last token of the text is a bonus
        steps.append(a + 1)
        t += a + 1
    return steps


def acceptance_record(choices: torch.Tensor, sequence: torch.Tensor, prompt_len: int, retrieval: int) -> dict:
    """The per-draft numbers of the module docstring for one prompt."""
    choices, sequence = choices.cpu(), sequence.cpu()
    tokens, length = sequence[0], sequence.shape[1]
    first = torch.arange(prompt_len, length - 1)  # level-1 choices of the answer's tokens 2.. (1: the prefill's)
    truth = tokens[first + 1]
    top1 = choices[0, first, 0] == truth
    topw = (choices[0, first] == truth[:, None]).any(dim=1)
    in_prompt = torch.isin(truth, tokens[:prompt_len])
    hits = level_hits(choices, sequence, prompt_len)
    levels = [hits[k - 1, prompt_len : length - k].float().mean().item() for k in range(1, hits.shape[0] + 1)]
    accepted = hits.long().cumprod(dim=0).sum(dim=0).tolist()
    chain = decode_steps(sequence, prompt_len, accepted)
    with_retrieval = decode_steps(sequence, prompt_len, accepted, retrieval) if retrieval else chain
    mean = lambda x: x.float().mean().item() if x.numel() else float("nan")  # noqa: E731
    return {
        "level_accuracy": levels, "first_top1": mean(top1), "first_topw": mean(topw),
        "first_top1_in_prompt": mean(top1[in_prompt]), "first_top1_new": mean(top1[~in_prompt]),
        "in_prompt_share": mean(in_prompt), "chain_steps": chain,
        "chain_tau": (length - prompt_len) / (len(chain) or 1),
        "chain_retrieval_tau": (length - prompt_len) / (len(with_retrieval) or 1),
    }


def markdown(rows: list[dict], names: list[str], width: int) -> str:
    cols = ["first top-1", f"first top-{width}", "top-1 in prompt / new", "level 2 / 3", "chain τ",
            "chain + retrieval τ"]
    lines = ["| dataset | bucket | prompts | draft | " + " | ".join(cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    for dataset, bucket in sorted({(r["dataset"], r["bucket"]) for r in rows}):
        group = [r for r in rows if (r["dataset"], r["bucket"]) == (dataset, bucket)]
        for name in names:
            recs = [r["drafts"][name] for r in group if name in r.get("drafts", {})]
            if not recs:
                continue
            m = lambda key: statistics.mean(x[key] for x in recs)  # noqa: E731
            lv = [statistics.mean(x["level_accuracy"][k] for x in recs) for k in (1, 2)]
            lines.append(f"| {dataset} | {bucket} | {len(recs)} | {name} | {m('first_top1'):.3f}"
                         f" | {m('first_topw'):.3f} | {m('first_top1_in_prompt'):.3f} / {m('first_top1_new'):.3f}"
                         f" | {lv[0]:.3f} / {lv[1]:.3f}"
                         f" | {m('chain_tau'):.2f} | {m('chain_retrieval_tau'):.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the target: a model folder, a .gguf file or 'smollm2'")
    p.add_argument("--drafts", required=True,
                   help="drafts of this target (folders or compact .safetensors files): NAME=PATH,... or PATH,...")
    add_prompt_arguments(p)
    p.add_argument("--depth", type=int, default=6, help="chain levels (the tau_matrix chain is [1] * 6)")
    p.add_argument("--width", type=int, default=4, help="first-level choices counted (the default tree's root)")
    p.add_argument("--retrieval", type=int, default=10, help="retrieval chain tokens (0: none)")
    p.add_argument("--answers", default=None, help="an earlier output of this script: its answers, not new ones")
    p.add_argument("--max-seconds", type=float, default=1e9, help="start no new prompt after this many seconds")
    p.add_argument("--out", required=True, help="the JSON file to write (the markdown table goes beside it)")
    args = p.parse_args()
    specs = [d.partition("=") for d in args.drafts.split(",")]
    drafts = {(name if sep else Path(name).stem): (path if sep else name) for name, sep, path in specs}
    missing = [path for path in drafts.values() if not Path(path).exists()]
    if missing:
        p.error(f"draft not found: {missing}")
    if args.depth < 1 or args.width < 1:
        p.error("--depth and --width must be >= 1")
    try:
        validate_retrieval_tokens(args.retrieval)
        rows = prompt_rows(args)
        kept = {r["id"]: r["answer_ids"] for r in json.loads(Path(args.answers).read_text())["rows"]} \
            if args.answers else {}
    except (ValueError, FileNotFoundError, KeyError, json.JSONDecodeError) as err:
        p.error(str(err))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target, tokenizer = load_target(args.target, getattr(torch, args.dtype))
    target = target.to(device)
    loaded = {name: load_draft(path, target).to(device) for name, path in drafts.items()}
    meta = {"commit": os.environ.get("LONGSPEC_COMMIT", "unknown"), "device": torch.cuda.get_device_name()
            if device == "cuda" else platform.processor(), "target": args.target, "drafts": drafts,
            "dtype": args.dtype, "depth": args.depth, "width": args.width, "retrieval": args.retrieval,
            "answers_from": args.answers}
    records, start = [], time.perf_counter()
    for dataset, row in rows:
        if time.perf_counter() - start > args.max_seconds:
            break  # the time is spent: the later prompts are left out
        ids = eval_prompt(row, tokenizer).to(device)
        record = {"id": row["_id"], "dataset": row.get("dataset") or dataset, "bucket": row.get("bucket", 0),
                  "prompt_tokens": ids.shape[1]}
        if record["id"] in kept:
            answer = torch.tensor([kept[record["id"]]], device=device)
        else:
            with torch.no_grad():
                answer = target.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens)[:, ids.shape[1]:]
        record["answer_ids"] = answer[0].tolist()
        sequence = torch.cat([ids, answer], dim=1)
        record["drafts"], passed_layers, passed = {}, None, None
        for name, draft in loaded.items():
            layers = tuple(draft.config.target_feature_layers or ())
            if layers != passed_layers:  # drafts reading the same target layers share one target pass
                passed_layers, passed = layers, target_pass(target, sequence, layers)
            choices = level_choices(draft, sequence, ids.shape[1], args.depth, args.width, passed)
            record["drafts"][name] = acceptance_record(choices, sequence, ids.shape[1], args.retrieval)
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k not in ("answer_ids", "drafts")}
                         | {n: round(r["chain_tau"], 3) for n, r in record["drafts"].items()}), flush=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": records}))
    table = markdown(records, list(loaded), args.width)
    Path(args.out).with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
