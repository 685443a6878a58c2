"""The distributed path on 2 CPU processes (gloo): accelerate + FSDP2 draft, sharded target, loadable checkpoints.

`distributed_worker.py` runs under `accelerate launch` with the shipped `trainers/distributed/fsdp2.yaml`; this test
trains the same draft in one process and compares the logged losses, the trained weights, the Trainer's step-3
FSDP checkpoint and the final draft saved by `save_trained_draft`. About 20 s on 2 cores.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from transformers_longspec import LongSpecDraft
from transformers_longspec.trainers import LongSpecTrainer, LongSpecTrainingArguments, TokenCollator
from transformers_longspec.trainers.sharding import wants_target_sharding

import distributed_worker as worker

CONFIG = Path(__file__).resolve().parents[2] / "trainers" / "distributed" / "fsdp2.yaml"

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")


def _one_process(tmp_path):
    args = LongSpecTrainingArguments(output_dir=str(tmp_path / "single"), per_device_train_batch_size=4,
                                     save_strategy="no", **worker.ARGS)
    target = worker.target()
    trainer = LongSpecTrainer(model=LongSpecDraft.from_target(target), target_model=target, args=args,
                              train_dataset=worker.rows(), data_collator=TokenCollator(pad_token_id=0))
    trainer.train()
    return trainer, target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_worker(out: Path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG), "--num_processes", "2",
           "--mixed_precision", "no", "--main_process_port", str(_free_port()), str(Path(worker.__file__)), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads((out / "result.json").read_text())


def test_two_processes_train_like_one_and_save_loadable_drafts(tmp_path):
    result = _run_worker(tmp_path)
    single, target = _one_process(tmp_path)
    assert result["world_size"] == 2 and result["fsdp"] and result["draft_sharded"]
    assert result["layers_sharded"] and result["shared_replicated"]

    # Same data, same global batch: the losses and the trained weights match the one-process run.
    losses = [h["loss"] for h in single.state.log_history if "loss" in h]
    assert result["losses"] == pytest.approx(losses, abs=1e-4) and losses[-1] < losses[0] - 1.0
    trained = single.model.state_dict()
    final = load_file(tmp_path / "final" / "model.safetensors")
    assert set(final) == set(trained)  # draft tensors only: no embedding / LM head
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["architectures"] == ["LongSpecDraft"] and config["model_type"] == "longspec_draft"
    for name, tensor in trained.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-4, atol=1e-5, msg=name)

    # The Trainer's FSDP checkpoint (full state dict) and the final folder load in one process, on the CPU.
    for folder in (tmp_path / "run" / "checkpoint-3", tmp_path / "final"):
        loaded = LongSpecDraft.from_pretrained(folder, target_model=target)
        for name, tensor in loaded.state_dict().items():
            torch.testing.assert_close(tensor, final[name], rtol=0, atol=0, msg=f"{folder.name}: {name}")


@pytest.mark.parametrize(
    ("mode", "world", "fsdp", "zero3", "expected"),
    [("auto", 1, True, False, False), ("auto", 2, False, False, False), ("auto", 2, True, False, True),
     ("auto", 2, False, True, True), ("fsdp", 2, False, False, True), ("none", 8, True, False, False)],
)
def test_when_the_target_is_sharded(mode, world, fsdp, zero3, expected):
    assert wants_target_sharding(mode, world, fsdp, zero3) is expected


def test_unknown_sharding_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="target_sharding"):
        LongSpecTrainingArguments(output_dir=str(tmp_path), target_sharding="zero3")
