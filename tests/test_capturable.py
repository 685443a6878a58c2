"""The code captured into CUDA graphs (`StaticTreeStep._draft`, `_verify`, `_accept_greedy`) runs on the CPU here with
the ops that a capture forbids turned into errors: a read of a device value on the host (`.item()`, `bool(t)`,
`nonzero`), and a tensor made from Python data (`torch.tensor(...)`, `t[i] = 3`), which on a GPU is a host-to-device
copy. A GPU capture fails on either ("operation not permitted when stream is capturing"); CI has no GPU, so this is
where such a regression is caught."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformers_longspec import LongSpecDraft, static_step

from tiny_models import make_target

FORBIDDEN = {
    torch.ops.aten._local_scalar_dense.default: "a device value read on the host (.item(), bool(), int())",
    torch.ops.aten.nonzero.default: "nonzero (its output size is read on the host)",
    torch.ops.aten.lift_fresh.default: "a tensor made from Python data (a host-to-device copy on a GPU)",
    torch.ops.aten.lift_fresh_copy.default: "a tensor made from Python data (a host-to-device copy on a GPU)",
}


class NoCaptureBreakers(TorchDispatchMode):
    """Raise on any op a CUDA graph capture forbids (`FORBIDDEN`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in FORBIDDEN:
            raise AssertionError(f"{func} inside captured code: {FORBIDDEN[func]}")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def guarded_steps(monkeypatch):
    """Every static-shape step runs its (would-be captured) draft + verification under `NoCaptureBreakers`; buckets
    of 8 tokens so that a short generation crosses several."""
    monkeypatch.setattr(static_step, "TAIL", 8)
    original, calls = static_step.StaticTreeStep._eager_step, []

    def guarded(self, bucket, accept_greedy=False, events=None):
        calls.append(accept_greedy)
        with NoCaptureBreakers():
            return original(self, bucket, accept_greedy, events)

    monkeypatch.setattr(static_step.StaticTreeStep, "_eager_step", guarded)
    return calls


def test_the_guard_catches_what_breaks_a_capture():
    x = torch.zeros(4, dtype=torch.bool)
    for breaker in (lambda: x[0].item(), lambda: x.nonzero(), lambda: x.__setitem__(0, True), lambda: bool(x[1])):
        with pytest.raises(AssertionError, match="inside captured code"), NoCaptureBreakers():
            breaker()
    with NoCaptureBreakers():  # device-side equivalents pass
        torch.where(torch.arange(4) == 0, True, x)
        x.long().argmax()


@pytest.mark.parametrize("feature", [False, True], ids=["plain", "target_hidden"])
@pytest.mark.parametrize("widths,retrieval,vocab", [
    ((4, 16, 16, 16, 16), 10, False), ((2, 2), 0, False), ((), 6, False), ((3, 5, 5), 4, True)], ids=str)
def test_captured_code_has_no_host_sync(family, widths, retrieval, vocab, feature, guarded_steps):
    """Greedy (acceptance inside the step) and with a logits processor (acceptance on the host): the step's code
    passes the guard, and the tokens are plain greedy's (a draft vocabulary included)."""
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, init_from_target=False, target_hidden_input=feature)
    if vocab:
        draft.set_draft_vocabulary(torch.arange(40, 90))
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(1)).repeat(1, 3)
    for extra in ({}, {"repetition_penalty": 1.3}):
        kwargs = dict(do_sample=False, max_new_tokens=30, **extra)
        out = target.generate(ids, assistant_model=draft, longspec_beam_widths=list(widths),
                              longspec_retrieval=retrieval, longspec_static_shapes=True, **kwargs)
        assert torch.equal(out, target.generate(ids, **kwargs))
    assert True in guarded_steps and False in guarded_steps  # both kinds of step were guarded
