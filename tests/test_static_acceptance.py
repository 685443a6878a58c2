"""Greedy acceptance and compaction inside the static-shape step (`StaticTreeStep._accept_greedy`) give exactly the
tokens, acceptance and cache rows of the eager path (`verification.accept` + `LongSpecCache.commit_path`)."""

import pytest
import torch

from transformers_longspec import LongSpecDraft, static_step

from tiny_models import make_target


@pytest.fixture
def calls(monkeypatch):
    """Counts `_accept_greedy` calls; buckets of 8 tokens so that a short generation crosses several."""
    monkeypatch.setattr(static_step, "TAIL", 8)
    counter = {"n": 0}
    original = static_step.StaticTreeStep._accept_greedy

    def counted(self, *args):
        counter["n"] += 1
        return original(self, *args)

    monkeypatch.setattr(static_step.StaticTreeStep, "_accept_greedy", counted)
    return counter


@pytest.mark.parametrize("widths,retrieval", [((4, 16, 16, 16, 16), 10), ((2, 2), 0), ((), 6), ((), 0)], ids=str)
def test_on_device_acceptance_equals_the_eager_path(family, widths, retrieval, calls):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 99, (1, 10), generator=g).repeat(1, 4)
    kwargs = dict(do_sample=False, max_new_tokens=40, longspec_beam_widths=list(widths), longspec_retrieval=retrieval)
    on_device = target.generate(ids, assistant_model=draft, longspec_static_shapes=True, **kwargs)
    accepted = draft.last_generation_stats.accepted_lengths
    assert calls["n"] == len(accepted) > 0
    eager = target.generate(ids, assistant_model=draft, longspec_static_shapes=False, **kwargs)
    assert torch.equal(on_device, eager) and torch.equal(on_device, target.generate(ids, do_sample=False,
                                                                                     max_new_tokens=40))
    assert draft.last_generation_stats.accepted_lengths == accepted
    # returned scores need the logits of each accepted node: that call takes the host path, same tokens
    before = calls["n"]
    out = target.generate(ids, assistant_model=draft, longspec_static_shapes=True, return_dict_in_generate=True,
                          output_scores=True, **kwargs)
    assert calls["n"] == before and torch.equal(out.sequences, on_device) and len(out.scores) == 40
