"""Optional Triton import for the kernel modules.

Triton is an optional dependency (`pip install triton`, or the `[triton]` extra). Without it the kernel
modules still import, so their `*_ref` twins work on any device, and each Triton launcher raises
`ImportError` through `require_triton` before touching a kernel. The stand-in below only lets the
`@triton.jit` definitions and their `tl.constexpr` annotations evaluate at import time; it is never launched.

`TRITON_INTERPRET=1` must be set in the environment before this module is first imported: Triton decides
at `@triton.jit` time whether a kernel is compiled or interpreted.
"""

import importlib.util


class _TritonStandIn:
    """Placeholder for `triton` and `triton.language` when Triton is not installed."""

    constexpr = None

    @staticmethod
    def jit(fn=None, **kwargs):
        """Return the undecorated function: it is never launched without Triton."""
        return fn if fn is not None else (lambda inner: inner)


if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl
else:
    triton = tl = _TritonStandIn()


def triton_available() -> bool:
    """Return True if Triton is installed, so the Triton launchers (e.g. `fused_mask_attn`) can run."""
    return not isinstance(triton, _TritonStandIn)


def require_triton(caller: str) -> None:
    """Raise ImportError naming the install command if Triton is missing.

    Raises: ImportError if Triton is not installed.
    """
    if not triton_available():
        raise ImportError(
            f"{caller} needs Triton: `pip install triton` (or `pip install 'transformers-longspec[triton]'`). "
            f"On CPU use {caller}_ref, the exact torch twin."
        )


def is_interpreted(kernel: object) -> bool:
    """Return True if `kernel` was built by Triton's interpreter (TRITON_INTERPRET=1), which runs on CPU tensors."""
    return triton_available() and not isinstance(kernel, triton.runtime.JITFunction)
