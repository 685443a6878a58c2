"""The draft model: construction from a target, shared weights, save/load, constant-memory cache."""

import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, GPT2Config, GPT2LMHeadModel

from transformers_longspec import LongSpecConfig, LongSpecDraft

from tiny_models import make_target


def test_draft_owns_no_target_weights(family):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target)
    names = [n for n, _ in draft.named_parameters()]
    assert names and not any("embed" in n or "lm_head" in n for n in names)
    target_ids = {id(p) for p in target.parameters()}
    assert not any(id(p) in target_ids for p in draft.parameters())
    assert draft.embed(torch.tensor([[5]])).data_ptr() != 0  # uses the target's embedding through the attachment
    assert draft.config.vocab_size == target.config.vocab_size
    assert (draft.config.eos_token_id, draft.config.bos_token_id) == (target.config.eos_token_id, 1)


def test_a_narrow_mlp_starts_from_the_targets_strongest_neurons():
    """intermediate_size below the target's: the draft's MLP is the target's last-layer MLP restricted to the
    neurons of largest ||up row|| x ||down column||, in their order; attention and norms are copied as they are."""
    target = make_target("llama", mlp_bias=True)
    last = target.model.layers[-1].mlp
    with torch.no_grad():
        for proj in (last.gate_proj, last.up_proj, last.down_proj):
            proj.bias.normal_(generator=torch.Generator().manual_seed(2))
    width = last.up_proj.weight.shape[0] // 4
    draft = LongSpecDraft.from_target(target, intermediate_size=width)
    strength = last.up_proj.weight.norm(dim=1) * last.down_proj.weight.norm(dim=0)
    keep = strength.topk(width).indices.sort().values
    mlp = draft.block.mlp
    assert mlp.up_proj.weight.shape == (width, target.config.hidden_size)
    assert torch.equal(mlp.gate_proj.weight, last.gate_proj.weight[keep])
    assert torch.equal(mlp.up_proj.weight, last.up_proj.weight[keep])
    assert torch.equal(mlp.down_proj.weight, last.down_proj.weight[:, keep])
    assert torch.equal(mlp.up_proj.bias, last.up_proj.bias[keep]) and torch.equal(mlp.down_proj.bias,
                                                                                  last.down_proj.bias)
    assert torch.equal(draft.block.self_attn.q_proj.weight, target.model.layers[-1].self_attn.q_proj.weight)


def test_save_load_round_trip(tmp_path, family):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, init_from_target=False, beam_widths=[3, 3])
    draft.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    own = dict(draft.state_dict())
    assert set(tensors) == set(own)
    vocab = target.config.vocab_size
    assert not any(vocab in t.shape for t in tensors.values())  # no embedding / LM head copy
    reloaded = LongSpecDraft.from_pretrained(tmp_path, target_model=target)
    for name, tensor in own.items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    ids = torch.randint(3, 99, (1, 30), generator=torch.Generator().manual_seed(0))
    a = target.generate(ids, assistant_model=draft, max_new_tokens=12, do_sample=False)
    b = target.generate(ids, assistant_model=reloaded, max_new_tokens=12, do_sample=False)
    assert torch.equal(a, b)
    assert draft.last_generation_stats.accepted_lengths == reloaded.last_generation_stats.accepted_lengths
    assert isinstance(AutoConfig.from_pretrained(tmp_path), LongSpecConfig)
    assert isinstance(AutoModel.from_pretrained(tmp_path), LongSpecDraft)


def test_unsupported_targets_are_refused():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=99))
    with pytest.raises(ValueError, match="support targets of type"):
        LongSpecDraft.from_target(gpt2)
    with pytest.raises(ValueError, match="sliding_window"):
        LongSpecDraft.from_target(make_target("mistral", sliding_window=16))


def test_draft_for_another_target_is_refused():
    draft = LongSpecDraft.from_target(make_target("llama"))
    other = make_target("llama", hidden_size=48, num_attention_heads=4)
    with pytest.raises(ValueError, match="hidden_size: draft 32 vs target 48"):
        draft.attach_target(other)
    with pytest.raises(ValueError, match="fixed by the target"):
        LongSpecDraft.from_target(make_target("llama"), vocab_size=120)


def test_draft_cache_does_not_grow_with_context():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, sliding_window=64)
    sizes = []
    for context in (2048, 16384):
        ids = torch.randint(3, 99, (1, context), generator=torch.Generator().manual_seed(context))
        target.generate(ids, assistant_model=draft, max_new_tokens=3, do_sample=False)
        sizes.append(draft.last_generation_stats.draft_cache_bytes)
    assert sizes[0] == sizes[1] > 0


def test_chunked_loss_keeps_no_logits_for_backward():
    """Only one chunk of logits lives at a time: none is saved for the backward pass, which recomputes them."""
    target = make_target("llama", vocab_size=1000)
    draft = LongSpecDraft.from_target(target)
    ids = torch.randint(3, 1000, (2, 64), generator=torch.Generator().manual_seed(0))
    keys, values = (torch.randn(2, 2, 64, 8) for _ in range(2))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        loss = draft(input_ids=ids, target_keys=keys, target_values=values, labels=ids, loss_chunk_size=16).loss
    assert saved and not any(shape[-1:] == (1000,) for shape in saved)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in draft.named_parameters()}
    draft.zero_grad()
    one_chunk = draft(input_ids=ids, target_keys=keys, target_values=values, labels=ids, loss_chunk_size=64).loss
    one_chunk.backward()
    torch.testing.assert_close(one_chunk, loss)
    for name, param in draft.named_parameters():
        torch.testing.assert_close(param.grad, grads[name], msg=name)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_keeps_the_gradients(reentrant):
    """The block's input is the frozen shared embedding: checkpointing (either kind) must still train the block."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target).train()
    ids = torch.randint(3, 99, (2, 24), generator=torch.Generator().manual_seed(0))
    keys, values = (torch.randn(2, 2, 24, 8) for _ in range(2))
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            draft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        draft.zero_grad()
        draft(input_ids=ids, target_keys=keys, target_values=values, labels=ids, noise_offset=2).loss.backward()
        grads.append({n: p.grad.clone() for n, p in draft.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


@pytest.mark.parametrize("seq", [1, 5, 8, 9, 16, 31])
def test_blockwise_sliding_window_equals_the_dense_mask(seq):
    """The training path's blockwise window attention == SDPA with the full (seq, seq) sliding-window mask."""
    from transformers_longspec.blocks import _attend, sliding_window_attention, sliding_window_causal_mask

    gen = torch.Generator().manual_seed(seq)
    q = torch.randn(2, 4, seq, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 2, seq, 8, generator=gen, requires_grad=True) for _ in range(2))
    dense = _attend(q, k, v, mask=sliding_window_causal_mask(seq, 8))
    blocked = sliding_window_attention(q, k, v, window=8)
    torch.testing.assert_close(blocked, dense)
    grads = torch.autograd.grad(dense.square().sum(), (q, k, v))
    for got, want in zip(torch.autograd.grad(blocked.square().sum(), (q, k, v)), grads, strict=True):
        torch.testing.assert_close(got, want)


def test_compact_file_round_trip_stays_exact(tmp_path):
    """save_compact: one int8 file about a quarter of the fp32 weights; every matrix comes back within half a step
    of its row's scale, norms and the vocabulary exactly, and generation with the reloaded draft is plain greedy."""
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, intermediate_size=48)
    draft.set_draft_vocabulary(torch.arange(3, 60))
    path = draft.save_compact(tmp_path / "draft.int8.safetensors")
    draft.save_pretrained(tmp_path / "folder", model_card=False)
    # int8 matrices + fp32 row scales (a real draft's file is ~26% of fp32; this tiny one carries relatively more
    # scales, norms and vocabulary ids)
    assert (tmp_path / "draft.int8.safetensors").stat().st_size < 0.4 * (tmp_path / "folder/model.safetensors").stat(
    ).st_size
    reloaded = LongSpecDraft.from_pretrained(path, target_model=target)
    assert not reloaded.training and reloaded.config.intermediate_size == 48
    saved, loaded = draft.state_dict(), reloaded.state_dict()
    assert set(saved) == set(loaded)
    for name, tensor in saved.items():
        if tensor.dim() == 2:
            step = tensor.abs().amax(dim=1, keepdim=True) / 127
            assert ((loaded[name] - tensor).abs() <= step / 2 + 1e-7).all(), name
            assert not tensor.any() or not torch.equal(loaded[name], tensor), name  # really rounded (0 stays 0)
        else:
            assert torch.equal(loaded[name], tensor), name
    ids = torch.randint(3, 99, (1, 40), generator=torch.Generator().manual_seed(1))
    plain = target.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(target.generate(ids, assistant_model=reloaded, max_new_tokens=16, do_sample=False), plain)


def test_int4_compact_file_halves_the_int8_one_and_stays_exact(tmp_path):
    """save_compact(bits=4): matrices whose width is a multiple of 64 in int4 groups of 32 columns (no group worse
    than plain absmax rounding, every group rounded), the 96-wide down_proj in int8, a file well under the int8
    one, exact generation."""
    from transformers_longspec.checkpoint import INT4_GROUP

    target = make_target("qwen2", hidden_size=128, intermediate_size=256)
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, intermediate_size=96)
    int8 = draft.save_compact(tmp_path / "draft.int8.safetensors")
    int4 = draft.save_compact(tmp_path / "draft.int4.safetensors", bits=4)
    assert os.path.getsize(int4) < 0.7 * os.path.getsize(int8)
    reloaded = LongSpecDraft.from_pretrained(int4, target_model=target)
    saved, loaded = draft.state_dict(), reloaded.state_dict()
    grouped = 0
    for name, tensor in saved.items():
        if tensor.dim() != 2 or not tensor.any():  # norms, ids, the zero-initialised hidden_proj: as they are
            assert torch.equal(loaded[name], tensor), name
            continue
        if tensor.shape[1] % (2 * INT4_GROUP) == 0:
            groups = tensor.view(tensor.shape[0], -1, INT4_GROUP)
            scale = (groups.abs().amax(dim=2, keepdim=True) / 7).half().float()
            plain = ((groups / scale).round().clamp(-8, 7) * scale - groups).square().sum(2)  # absmax rounding
            error = (loaded[name].view_as(groups) - groups).square().sum(2)
            assert (error <= plain * (1 + 1e-5) + 1e-12).all() and (error > 0).all(), name
            assert len(loaded[name].view_as(groups)[0, 0].unique()) <= 16, name
            grouped += 1
        else:
            step = tensor.abs().amax(dim=1, keepdim=True) / 127
            assert ((loaded[name] - tensor).abs() <= step / 2 + 1e-7).all(), name
    assert grouped >= 5 and saved["block.mlp.down_proj.weight"].shape[1] == 96
    ids = torch.randint(3, 99, (1, 40), generator=torch.Generator().manual_seed(2))
    plain = target.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(target.generate(ids, assistant_model=reloaded, max_new_tokens=16, do_sample=False), plain)
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        draft.save_compact(tmp_path / "d.safetensors", bits=2)


def test_compact_file_errors_name_the_fix(tmp_path, monkeypatch):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    draft.save_pretrained(tmp_path / "folder", model_card=False)
    with pytest.raises(ValueError, match="not a compact LongSpec draft"):
        LongSpecDraft.from_pretrained(tmp_path / "folder/model.safetensors", target_model=target)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a safetensors file"):
        LongSpecDraft.from_pretrained(tmp_path / "notes.txt", target_model=target)
    path = draft.save_compact(tmp_path / "draft.safetensors")
    with pytest.raises(ValueError, match="target_model and dtype only"):
        LongSpecDraft.from_pretrained(path, target_model=target, device_map="cpu")
    assert LongSpecDraft.from_pretrained(path, dtype=torch.bfloat16).block.mlp.up_proj.weight.dtype == torch.bfloat16
    assert LongSpecDraft.from_pretrained(path, dtype="bfloat16").block.mlp.up_proj.weight.dtype == torch.bfloat16
    assert LongSpecDraft.from_pretrained(path, target_model=target, dtype="auto").norm.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="'int8x' is not a torch dtype"):
        LongSpecDraft.from_pretrained(path, dtype="int8x")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # "~" is expanded and missing folders are made
    assert LongSpecDraft.from_pretrained(draft.save_compact("~/drafts/d.safetensors")).config.vocab_size == 99
    pytest.importorskip("peft")
    from transformers_longspec.trainers import add_lora_to_draft

    with pytest.raises(ValueError, match="merge_lora_draft"):
        add_lora_to_draft(draft).save_compact(tmp_path / "lora.safetensors")
