"""Stop a training run after a wall-clock budget, keeping everything it learned so far.

A GPU lease is bought in minutes, not steps: `longspec train --max-minutes M` (or this callback passed to any
`Trainer`) ends training at the first optimizer step that finishes after M minutes of `train()`, and the run then
saves its draft as if `max_steps` had been reached. The learning-rate schedule still spans `max_steps`: set it
near the steps the budget allows (the summary's `train_steps_per_second` says how many that is) so the cosine
decay is not cut short.

Reference: transformers `TrainerCallback.on_step_end` / `TrainerControl.should_training_stop`.
"""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback

__all__ = ["TimeBudgetCallback"]


class TimeBudgetCallback(TrainerCallback):
    """End training once `seconds` of wall-clock time have passed since `on_train_begin`.

    Under several processes every process stops at the same step: the decision is the maximum over processes
    (one all-reduce of one number per step), so no process waits in a collective the others have left.

    Args:
        seconds: the budget in seconds (> 0), counted from the start of `Trainer.train`.
    Attributes:
        stopped_at_step: the global step at which the budget ended training, or None while it has not.
    Raises:
        ValueError: if `seconds` is not a positive number.
    """

    def __init__(self, seconds: float):
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"the training time budget must be a positive number of seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.stopped_at_step: int | None = None
        self._start: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        over = float(time.perf_counter() - self._start >= self.seconds)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([over], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            over = flag.item()
        if over and not control.should_training_stop:
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
        return control
