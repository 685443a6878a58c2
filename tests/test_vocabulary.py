"""The draft's own vocabulary (`vocabulary.py`): proposals come only from it and the prompt's tokens, the output stays
plain greedy, and it travels with the saved weights."""

import pytest
import torch

from transformers_longspec import LongSpecConfig, LongSpecDraft, static_step, vocabulary
from transformers_longspec import generation as generation_module
from transformers_longspec.vocabulary import DraftVocabulary, frequent_tokens

from tiny_models import make_target


def _prompt(seed: int, length: int, low: int = 3, high: int = 99) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (1, length), generator=g)


def test_frequent_tokens_ranks_by_count_then_id():
    rows = [[5, 5, 7, 9], {"input_ids": torch.tensor([7, 5, 9, 9, 9])}, [1]]  # counts: 9 x4, 5 x3, 7 x2, 1 x1
    assert frequent_tokens(rows, 3, vocab_size=20).tolist() == [9, 5, 7]
    assert frequent_tokens([[4, 3], [3, 4]], 2, vocab_size=20).tolist() == [3, 4]  # a tie: the smaller id first
    with pytest.raises(ValueError, match="4 distinct tokens, fewer than draft_vocab_size=5"):
        frequent_tokens(rows, 5, vocab_size=20)
    with pytest.raises(ValueError, match="0 < size < vocab_size=20"):
        frequent_tokens(rows, 20, vocab_size=20)


def test_fill_adds_the_prompts_most_frequent_other_tokens(monkeypatch):
    monkeypatch.setattr(vocabulary, "PROMPT_SLOTS", 2)
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    draft.set_draft_vocabulary(torch.tensor([10, 11, 12]))
    vocab = DraftVocabulary(draft)
    added = vocab.fill(draft, torch.tensor([11, 40, 41, 41, 42, 42, 42, 10]))  # 42 x3, 41 x2, 40 x1 are new
    assert added == 2 and vocab.ids.tolist() == [10, 11, 12, 42, 41]
    assert vocab.bias.tolist() == [0.0] * 5
    assert torch.equal(vocab.weight, target.lm_head.weight[[10, 11, 12, 42, 41]])
    assert vocab.fill(draft, torch.tensor([12, 12])) == 0  # a new call: nothing of the last prompt stays
    assert vocab.ids[:3].tolist() == [10, 11, 12] and vocab.bias[3:].tolist() == [float("-inf")] * 2
    fewer = DraftVocabulary(draft, frequent=2)  # 10 and 11 only: 12 counts as the prompt's own
    assert fewer.fill(draft, torch.tensor([12, 40, 12])) == 2 and fewer.ids.tolist() == [10, 11, 12, 40]
    for bad in (0, 4):
        with pytest.raises(ValueError, match="this draft has 3; use 1 to 3"):
            DraftVocabulary(draft, frequent=bad)


def _recorded_trees(monkeypatch, module):
    trees, grow = [], module.grow_tree

    def recording(*args, **kwargs):
        tree = grow(*args, **kwargs)
        trees.append((tree.tokens.clone(), tree.parents.clone()))
        return tree

    monkeypatch.setattr(module, "grow_tree", recording)
    return trees


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_drafts_propose_only_their_vocabulary_and_the_prompt_and_stay_exact(family, static, monkeypatch):
    """Tokens 3..30 in the prompt, a vocabulary of 60..79: every drafted token lies in one of the two sets (most of the
    target's greedy tokens lie in neither), and the output is plain greedy's."""
    monkeypatch.setattr(static_step, "TAIL", 8)
    trees = _recorded_trees(monkeypatch, static_step if static else generation_module)
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=[3, 6, 6])
    draft.set_draft_vocabulary(torch.arange(60, 80))
    ids = _prompt(4, 50, high=31)
    plain = target.generate(ids, do_sample=False, max_new_tokens=30)
    spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=30,
                           longspec_static_shapes=static, longspec_retrieval=0)
    assert torch.equal(plain, spec)
    allowed = set(range(60, 80)) | set(ids[0].tolist())
    drafted = {t for tokens, _ in trees for t in tokens[1:].tolist()}
    assert trees and drafted <= allowed
    assert draft.last_generation_stats.draft_vocab_tokens == 20 + len(set(ids[0].tolist()))
    full = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=30,
                           longspec_static_shapes=static, longspec_retrieval=0, longspec_draft_vocab=False)
    assert torch.equal(full, plain) and draft.last_generation_stats.draft_vocab_tokens == 0
    trees.clear()  # the 5 most frequent of the draft's tokens (60..64) and the prompt's: the others are never drafted
    fewer = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=30,
                            longspec_static_shapes=static, longspec_retrieval=0, longspec_draft_vocab=5)
    drafted = {t for tokens, _ in trees for t in tokens[1:].tolist()}
    assert torch.equal(fewer, plain) and trees and drafted <= set(range(60, 65)) | set(ids[0].tolist())
    assert draft.last_generation_stats.draft_vocab_tokens == 5 + len(set(ids[0].tolist()))


def test_siblings_stay_distinct_when_the_prompt_repeats_vocabulary_tokens(monkeypatch):
    """Sampling's acceptance rule is exact for any tree whose siblings carry distinct tokens (`test_sampling.py`); a
    prompt token already in the draft's vocabulary must not get a second slot (it would be proposed twice)."""
    trees = _recorded_trees(monkeypatch, generation_module)
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 8])
    draft.set_draft_vocabulary(torch.arange(3, 40))
    ids = _prompt(1, 30, low=20, high=60)  # half of its tokens are in the vocabulary already
    torch.manual_seed(7)
    out = target.generate(ids, assistant_model=draft, do_sample=True, max_new_tokens=20, longspec_retrieval=0)
    assert 30 < out.shape[1] <= 50 and draft.last_generation_stats.draft_vocab_tokens == len(set(range(3, 60)) & (
        set(range(3, 40)) | set(ids[0].tolist())))
    for tokens, parents in trees:
        children = list(zip(parents[1:].tolist(), tokens[1:].tolist()))
        assert len(set(children)) == len(children)  # no (parent, token) pair twice


def test_padding_slots_are_dead_so_live_siblings_stay_distinct(monkeypatch):
    """longspec_draft_vocab=1 and a prompt of one token: each level offers 2 real tokens for up to 4 children, the
    rest are padding slots (token 0, score -inf). Those nodes are dead (never accepted), so the siblings that may be
    accepted carry distinct tokens and sampling stays exact; greedy output is plain greedy's."""
    trees, grow = [], generation_module.grow_tree

    def recording(*args, **kwargs):
        tree = grow(*args, **kwargs)
        trees.append(tree)
        return tree

    monkeypatch.setattr(generation_module, "grow_tree", recording)
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 4])
    draft.set_draft_vocabulary(torch.arange(60, 80))
    ids = torch.full((1, 12), 61)
    torch.manual_seed(3)
    target.generate(ids, assistant_model=draft, do_sample=True, max_new_tokens=6, longspec_retrieval=0,
                    longspec_draft_vocab=1)
    assert trees
    for tree in trees:
        assert tree.alive is not None and torch.equal(tree.alive, torch.isfinite(tree.scores))
        assert not tree.alive.all()  # 2 real tokens (60 and 61) for 4 slots at depth 1
        live = [(p, t) for p, t, a in zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist(),
                                          tree.alive[1:].tolist()) if a]
        assert len(set(live)) == len(live)
    plain = target.generate(ids, do_sample=False, max_new_tokens=12)
    assert torch.equal(target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=12,
                                       longspec_draft_vocab=1), plain)


def test_the_vocabulary_is_saved_with_the_draft(tmp_path):
    target = make_target("mistral")
    draft = LongSpecDraft.from_target(target)
    draft.set_draft_vocabulary(torch.tensor([5, 9, 33]))
    draft.save_pretrained(tmp_path, model_card=False)
    loaded = LongSpecDraft.from_pretrained(tmp_path, target_model=target)
    assert loaded.config.draft_vocab_size == 3 and loaded.draft_vocab.tolist() == [5, 9, 33]


def test_bad_vocabulary_options_are_refused_with_the_fix():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    ids = _prompt(0, 12)
    with pytest.raises(ValueError, match="proposes from the whole vocabulary"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, longspec_draft_vocab=True)
    with pytest.raises(ValueError, match="proposes from the whole vocabulary"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, longspec_draft_vocab=16)
    with pytest.raises(ValueError, match="longspec_draft_vocab must be True, False, an int"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, longspec_draft_vocab="yes")
    with pytest.raises(ValueError, match="longspec_draft_vocab=-1: a count of frequent tokens cannot be negative"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, longspec_draft_vocab=-1)
    with pytest.raises(ValueError, match="longspec_static_shapes must be True, False or None"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, longspec_static_shapes="yes")
    assert "_tree_policy" not in draft.__dict__  # refused before any work: the default tree was not even timed
    with pytest.raises(ValueError, match="repeats token ids"):
        draft.set_draft_vocabulary(torch.tensor([4, 4]))
    draft.set_draft_vocabulary(torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="longspec_draft_vocab=3: this draft's vocabulary holds 2 frequent"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, longspec_draft_vocab=3)
    resolve = generation_module.resolve_draft_vocab
    config = target.generation_config
    assert [resolve(draft, config, v) for v in (None, True, False, 0, 1, torch.tensor(2))] == [2, 2, 0, 0, 1, 2]
    with pytest.raises(ValueError, match=r"token ids in \[0, 99\)"):
        draft.set_draft_vocabulary(torch.tensor([3, 99]))
    with pytest.raises(ValueError, match="a set of token ids, not a size"):
        LongSpecDraft.from_target(target, draft_vocab_size=40)
    with pytest.raises(ValueError, match="draft_vocab_size must be an int"):
        LongSpecConfig.from_target_config(target.config, draft_vocab_size=99)
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=6)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=6))
