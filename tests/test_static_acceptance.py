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


def test_chained_steps_equal_the_eager_path_and_a_step_chained_past_eos_is_dropped(family, monkeypatch):
    """Steps launched before their predecessor is read back (`StaticTreeStep.chain_greedy`) read their root from
    the device: the same tokens and acceptance as the eager path; when a step ends the call (EOS), the step chained
    behind it is dropped and the next call starts clean."""
    monkeypatch.setattr(static_step, "TAIL", 16)
    launches = []
    launch, chain = static_step.StaticTreeStep.launch_greedy, static_step.StaticTreeStep.chain_greedy
    monkeypatch.setattr(static_step.StaticTreeStep, "launch_greedy",
                        lambda self, *args: launches.append("host") or launch(self, *args))
    monkeypatch.setattr(static_step.StaticTreeStep, "chain_greedy",
                        lambda self, *args: (lambda step: launches.append(step and "chained") or step)(
                            chain(self, *args)))
    target = make_target(family)
    target.generation_config.eos_token_id = None  # EOS only where the test names one
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 99, (1, 9), generator=g).repeat(1, 3)
    kwargs = dict(do_sample=False, max_new_tokens=48, longspec_beam_widths=[2, 2], longspec_retrieval=4)
    plain = target.generate(ids, do_sample=False, max_new_tokens=48)
    new = plain[0, ids.shape[1]:].tolist()
    stop = max(i for i in range(30) if new[i] not in new[:i])  # EOS: the token first met latest among the first 30
    for eos in (None, new[stop]):
        launches.clear()
        out = target.generate(ids, assistant_model=draft, longspec_static_shapes=True, eos_token_id=eos, **kwargs)
        accepted = draft.last_generation_stats.accepted_lengths
        assert launches.count("chained") > 0 and launches.count("host") > 1  # both kinds of launch
        launched = launches.count("chained") + launches.count("host")
        assert launched == len(accepted) + (eos is not None)  # the step chained behind the EOS step: dropped
        want = plain if eos is None else plain[:, : ids.shape[1] + stop + 1]
        assert torch.equal(out, want)
        assert torch.equal(out, target.generate(ids, assistant_model=draft, longspec_static_shapes=False,
                                                eos_token_id=eos, **kwargs))
        assert draft.last_generation_stats.accepted_lengths == accepted
    other = torch.randint(3, 99, (1, 30), generator=g)
    assert torch.equal(target.generate(other, assistant_model=draft, longspec_static_shapes=True, **kwargs),
                       target.generate(other, do_sample=False, max_new_tokens=48))
