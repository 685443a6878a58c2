"""Stop a training run after a wall-clock budget, keeping everything it learned so far, with its schedule finished.

A GPU lease is bought in minutes, not steps: `longspec train --max-minutes M` (or this callback passed to any
`Trainer`) ends training at the first optimizer step that finishes after M minutes of `train()`, and the run then
saves its draft as if `max_steps` had been reached.

The learning-rate schedule follows the clock too. A cosine schedule set for `max_steps` but cut by the budget stops
with its learning rate still high (a session-7 lease stopped at step 663 of 1,150 with 42% of the peak rate left):
the draft never gets the low-rate end of training. So the schedule sees the step `max(step, elapsed / budget ×
max_steps)`: whichever of the step count and the clock is further along. A run that keeps pace with `max_steps`
is unchanged; a slower one (a shared GPU, longer rows) reaches the schedule's end when the budget ends. Only
schedules that are a `torch.optim.lr_scheduler.LambdaLR` (every `lr_scheduler_type` of transformers except
`reduce_lr_on_plateau`) are adapted; `anneal=False` keeps the schedule in steps.

Reference: transformers `TrainerCallback.on_train_begin` (receives `lr_scheduler`), `on_optimizer_step` (runs
between `optimizer.step()` and `lr_scheduler.step()`), `on_step_end`,
`TrainerControl.should_training_stop`; PyTorch `LambdaLR.lr_lambdas`.
"""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback

__all__ = ["TimeBudgetCallback"]


class TimeBudgetCallback(TrainerCallback):
    """End training once `seconds` of wall-clock time have passed since `on_train_begin`; anneal by the clock.

    Under several processes every process stops at the same step and sees the same schedule: the elapsed time is
    the maximum over processes (one all-reduce of one number per step), so no process waits in a collective the
    others have left and no two processes step with different learning rates.

    Args:
        seconds: the budget in seconds (> 0), counted from the start of `Trainer.train`.
        anneal: let the learning-rate schedule advance with the clock (module docstring); False = in steps only.
    Attributes:
        stopped_at_step: the global step at which the budget ended training, or None while it has not.
        elapsed_s: seconds of training at the last optimizer step (the maximum over processes).
    Raises:
        ValueError: if `seconds` is not a positive number.
    """

    def __init__(self, seconds: float, anneal: bool = True):
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"the training time budget must be a positive number of seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.anneal = anneal
        self.stopped_at_step: int | None = None
        self.elapsed_s = 0.0
        self._start: float | None = None
        self._max_steps = 0

    def schedule_step(self, step: int) -> int:
        """The step the learning-rate schedule sees at optimizer step `step`: `max(step, elapsed / budget ×
        max_steps)`, at most `max_steps`."""
        by_clock = int(min(self.elapsed_s / self.seconds, 1.0) * self._max_steps)
        return max(step, by_clock)

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        self._start = time.perf_counter()
        self.elapsed_s = 0.0
        self._max_steps = state.max_steps
        if self.anneal and isinstance(lr_scheduler, torch.optim.lr_scheduler.LambdaLR) \
                and not getattr(lr_scheduler, "_longspec_by_clock", False):
            lr_scheduler.lr_lambdas = [_by_clock(f, self) for f in lr_scheduler.lr_lambdas]
            lr_scheduler._longspec_by_clock = True  # one wrapping, also when train() runs again

    def on_optimizer_step(self, args, state, control, **kwargs):
        # after optimizer.step(), before lr_scheduler.step(): the schedule's next rate sees this step's clock
        elapsed = time.perf_counter() - self._start
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            clock = torch.tensor([elapsed], device=args.device, dtype=torch.float64)
            torch.distributed.all_reduce(clock, op=torch.distributed.ReduceOp.MAX)
            elapsed = clock.item()
        self.elapsed_s = elapsed

    def on_step_end(self, args, state, control, **kwargs):
        if self.elapsed_s >= self.seconds and not control.should_training_stop:
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
        return control


def _by_clock(lr_lambda, budget: TimeBudgetCallback):
    """`lr_lambda` evaluated at the budget's schedule step instead of the optimizer step."""
    return lambda step: lr_lambda(budget.schedule_step(step))
