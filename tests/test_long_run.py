"""1,000 LongSpec generations back to back: no state carried between calls, no growth in process memory."""

import time
from pathlib import Path

import pytest
import torch

from transformers_longspec import LongSpecDraft

from tiny_models import make_target


def _rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the GPU run (CUDA graphs) needs a GPU"))])
def test_thousand_generations_stay_exact_and_flat(device):
    target = make_target("qwen2").to(device)
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2, 2], sliding_window=16).to(device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 99, (1, int(n)), generator=g).to(device)
               for n in torch.randint(1, 60, (10,), generator=g)]
    lengths = [int(n) for n in torch.randint(1, 12, (10,), generator=g)]
    expected = [target.generate(p, do_sample=False, max_new_tokens=n) for p, n in zip(prompts, lengths)]
    rss, gpu = [], []
    start = time.perf_counter()
    for i in range(1000):
        k = i % 10
        out = target.generate(prompts[k], assistant_model=draft, do_sample=False, max_new_tokens=lengths[k])
        assert torch.equal(out, expected[k]), f"call {i} differs from a fresh call"
        assert draft.last_generation_stats.new_tokens == expected[k].shape[1] - prompts[k].shape[1]
        if i in (100, 999):
            rss.append(_rss_bytes())
            gpu.append(torch.cuda.memory_allocated() if device == "cuda" else 0)
    print(f"{device}: 1000 calls in {time.perf_counter() - start:.1f} s; process memory {rss[0] / 2**20:.0f} -> "
          f"{rss[1] / 2**20:.0f} MiB, GPU memory allocated {gpu[0]} -> {gpu[1]} bytes (calls 100 -> 999)")
    assert rss[1] - rss[0] < 16 * 2**20, f"memory grew by {(rss[1] - rss[0]) / 2**20:.1f} MiB over 900 calls"
    assert gpu[1] == gpu[0], f"GPU memory allocated grew by {gpu[1] - gpu[0]} bytes over 900 calls"
