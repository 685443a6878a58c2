"""Worker of test_distributed.py: `LongSpecTrainer` on 2 CPU processes under accelerate + FSDP2 (gloo).

    accelerate launch --config_file trainers/distributed/fsdp2.yaml --num_processes 2 --mixed_precision no \\
        tests/trainers/distributed_worker.py OUT_DIR

The run of the GPU recipe, on CPUs: the shipped accelerate config, accelerate's FSDP2 preparation of the draft,
the target sharded by the trainer (`target_sharding="auto"`), the Trainer's FSDP checkpoint at step 3 and the
final draft from `save_trained_draft`. accelerate turns FSDP on only for accelerator devices, so
`_fsdp_on_cpu` lets it keep the FSDP plugin for gloo CPU processes (test-only; torch's FSDP2 itself runs on CPU).
Rank 0 writes OUT_DIR/result.json; the test compares it with a one-process run.
"""

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (tiny_models)

from tiny_models import make_target  # noqa: E402

# Shared with the test: the one-process reference uses the same target, rows and arguments (batch 4 = 2 x 2).
ROWS = 4
SEQ = 32
ARGS = {"use_cpu": True, "report_to": [], "disable_tqdm": True, "learning_rate": 0.5, "optim": "sgd",
        "lr_scheduler_type": "constant", "max_steps": 3, "logging_steps": 1, "seed": 0, "anchor_offset": False,
        "noisy_training": False, "loss_chunk_size": 8, "max_grad_norm": 1.0}


def rows():
    """Training rows: every step sees all of them (4 rows, global batch 4), so 1 and 2 processes see the same."""
    return [{"input_ids": torch.randint(3, 99, (SEQ,), generator=torch.Generator().manual_seed(i))}
            for i in range(ROWS)]


def target():
    """The tiny target both runs use (Qwen2 layout with a tied embedding / LM head, as Qwen2.5-1.5B)."""
    return make_target("qwen2", tie_word_embeddings=True)


def _fsdp_on_cpu():
    """Let accelerate treat gloo CPU processes like accelerator processes, so it keeps the FSDP plugin.

    Two private touch points of accelerate's `PartialState` (its backend choice and its `cpu` flag); the device
    stays the CPU through `ACCELERATE_TORCH_DEVICE`. Test-only: on GPUs accelerate needs no help.
    """
    import accelerate.state
    from accelerate.utils import DistributedType

    init = accelerate.state.PartialState.__init__

    def cpu_as_accelerator(self, cpu: bool = False, **kwargs):
        init(self, cpu=False, **kwargs)

    def gloo_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        return "gloo", DistributedType.MULTI_GPU

    accelerate.state.PartialState.__init__ = cpu_as_accelerator
    accelerate.state.PartialState._prepare_backend = gloo_backend
    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"


def main():
    from torch.distributed.fsdp import FSDPModule

    from transformers_longspec import LongSpecDraft
    from transformers_longspec.trainers import (
        LongSpecTrainer,
        LongSpecTrainingArguments,
        TokenCollator,
        save_trained_draft,
    )

    torch.set_num_threads(1)
    _fsdp_on_cpu()
    out = Path(sys.argv[1])
    args = LongSpecTrainingArguments(output_dir=str(out / "run"), per_device_train_batch_size=2,
                                     save_strategy="steps", save_steps=3, **ARGS)
    tgt = target()
    trainer = LongSpecTrainer(model=LongSpecDraft.from_target(tgt), target_model=tgt, args=args,
                              train_dataset=rows(), data_collator=TokenCollator(pad_token_id=0))
    trainer.train()
    save_trained_draft(trainer, out / "final")
    shared = (tgt.get_input_embeddings().weight, tgt.get_output_embeddings().weight)
    result = {
        "world_size": trainer.args.world_size, "fsdp": trainer.is_fsdp_enabled,
        "draft_sharded": isinstance(trainer.model, FSDPModule),
        "layers_sharded": type(tgt.get_decoder().layers[0].mlp.up_proj.weight).__name__ == "DTensor",
        "shared_replicated": all(type(w) is torch.nn.Parameter for w in shared),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }
    if trainer.is_world_process_zero():
        (out / "result.json").write_text(json.dumps(result))
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
