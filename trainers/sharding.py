"""Shard the frozen target across processes (FSDP2) while the engine of the run trains the draft.

Under `accelerate launch` only the model handed to the `Trainer` (the draft) is prepared by the engine (FSDP,
DeepSpeed, DDP). The frozen target is sharded here instead, by `LongSpecTrainer.__init__`, before the engine
sees the draft:

    unit                              parameters                  when they are whole on a process
    target decoder layer i            sharded over all processes  during that layer's forward only
    target decoder (final norm ...)   sharded                     during the decoder's forward
    embed_tokens, lm_head             replicated on every process always (the draft calls them)

The embedding and LM head stay whole because the draft uses them outside the target's forward: the embedding
on every batch, the LM head on every loss chunk and again in the backward pass. Sharding them would cost an
all-gather of vocab x hidden weights per chunk; keeping them costs 2 x vocab x hidden x 2 bytes per GPU in bf16,
once when they are tied (0.47 GB for Qwen2.5-1.5B, 2.1 GB for Llama-3-70B's untied pair). They are still
wrapped as FSDP units whose every parameter is ignored: an engine that shards a model's input/output
embeddings as units of their own (accelerate's FSDP2 preparation finds them through the draft's
`get_input_embeddings()`) skips modules that already are FSDP units, so the target's shared weights are never
sharded behind the trainer's back. The target runs under `no_grad`, so nothing of it is kept for the backward
pass and no gradient of it is ever reduced.

Reference: LongSpec (arXiv 2502.17421) §3.2 (the draft reads the frozen target); PyTorch
`torch.distributed.fsdp.fully_shard` (FSDP2, `ignored_params` since 2.7).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from packaging import version

__all__ = ["TARGET_SHARDING_MODES", "shard_target", "target_is_sharded", "wants_target_sharding"]

TARGET_SHARDING_MODES = ("auto", "fsdp", "none")


def wants_target_sharding(mode: str, world_size: int, fsdp: bool, deepspeed_zero3: bool) -> bool:
    """Whether the trainer shards the target: "fsdp" always (with > 1 process), "auto" under FSDP or ZeRO-3.

    Args:
        mode: one of `TARGET_SHARDING_MODES` ("auto", "fsdp", "none").
        world_size: number of training processes.
        fsdp: the draft trains under FSDP (accelerate's FSDP plugin is active).
        deepspeed_zero3: the draft trains under DeepSpeed ZeRO stage 3.
    Returns: True to shard the target with `shard_target`, False to keep a whole copy per process.
    Raises: ValueError for an unknown mode.
    """
    if mode not in TARGET_SHARDING_MODES:
        raise ValueError(f"target_sharding must be one of {TARGET_SHARDING_MODES}, got {mode!r}")
    if world_size < 2 or mode == "none":
        return False
    return mode == "fsdp" or fsdp or deepspeed_zero3


def target_is_sharded(target) -> bool:
    """True if `shard_target` (or another FSDP2 `fully_shard`) already sharded `target`'s decoder."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(target.get_decoder(), FSDPModule)


def shard_target(target, device: torch.device | str):
    """Shard the frozen target's decoder layers over all processes; keep its embedding and LM head replicated.

    Each decoder layer and then the decoder itself become FSDP2 units over a 1-D mesh of every process of the
    default process group; the input embedding and the LM head are moved whole to `device` and wrapped as units
    with no sharded parameter (see the module docstring). Layers are moved to `device` one at a time while they
    are sharded, so a target loaded on the CPU never needs to fit whole on one GPU. Call on every process, after
    the target is frozen and cast, before the engine prepares the draft.

    Args:
        target: a frozen `*ForCausalLM` (eval mode, no grads), on the CPU or on `device`.
        device: this process's device (`TrainingArguments.device`): its type picks the mesh ("cuda", "cpu").
    Returns: `target`, sharded in place (its modules keep their names; parameters of the layers become DTensors).
    Raises: RuntimeError if torch.distributed is not initialized or torch < 2.7 (no `ignored_params`).
    Reference: PyTorch `fully_shard`, `init_device_mesh`.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("shard_target needs torch.distributed initialized (run under accelerate launch / torchrun)")
    if version.parse(torch.__version__.split("+")[0]) < version.parse("2.7"):
        raise RuntimeError(f"sharding the target needs torch >= 2.7 (FSDP2 ignored_params), found {torch.__version__}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = torch.device(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    decoder = target.get_decoder()
    replicated = [m for m in (target.get_input_embeddings(), target.get_output_embeddings()) if m is not None]
    kept = {p for m in replicated for p in m.parameters()}
    for module in replicated:
        module.to(device)
        fully_shard(module, mesh=mesh, ignored_params=set(module.parameters()))
    for layer in decoder.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(decoder, mesh=mesh, reshard_after_forward=True, ignored_params=kept)
    return target
