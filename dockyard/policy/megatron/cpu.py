"""megatron-core on a CPU-only torch: megatron 0.16 is written for CUDA and names the device in a
few places that have nothing CUDA-specific in them (its optimizers' scale and overflow buffers,
RoPE's frequency table, the default causal mask, the checkpoint writer's synchronize, a
`param.type() == 'torch.cuda.FloatTensor'` check, and the MoE all-to-all dispatcher's side stream for
copying its split sizes to the host). On a machine without CUDA those calls go to the CPU instead;
nothing changes where CUDA exists. The gloo process groups and every computation are megatron's own."""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode


class _CudaNamesOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            # megatron's optimizers accept "torch.cuda.<dtype>Tensor" parameters only
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


class _HostStream:
    """A CUDA stream's place on the CPU: work is already in order, so waits and events are done at once.
    A class, as torch.cuda.Stream is (transformers builds `torch.cuda.Stream | None` annotations)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass

    def record_event(self, event=None) -> "_HostStream":
        return self

    def synchronize(self) -> None:
        pass


_HOST_STREAM = _HostStream()
_active = False


def use_cpu() -> None:
    """For the rest of the process (a trainer rank): megatron's CUDA device names mean the CPU."""
    global _active
    if _active or torch.cuda.is_available():
        return
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.Stream = _HostStream
    torch.cuda.current_stream = lambda *args, **kwargs: _HOST_STREAM
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    _sizes_as_numbers()
    _CudaNamesOnCpu().__enter__()
    _active = True


def _sizes_as_numbers() -> None:
    """The all-to-all dispatcher hands its split sizes to all_to_all_single as host numpy arrays, made by
    a helper that converts GPU tensors only; on the CPU they stay tensors, which the collective refuses."""
    with quiet_import():
        from megatron.core.transformer.moe import token_dispatcher

    def to_host(tensor, as_numpy=False, record_stream=False):
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host


def without_transformer_engine() -> None:
    """megatron 0.16's MoE router reads the name `te_general_gemm`, which its module defines only when
    transformer-engine imports (a NameError on any machine without it, GPU or not)."""
    with quiet_import():
        from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def quiet_megatron() -> None:
    """megatron logs every parameter and its whole optimizer config at INFO, and warns of its own and
    torch's deprecations on every save and load; a run's log keeps dockyard's lines and real problems."""
    import logging
    import warnings

    logging.getLogger("megatron").setLevel(logging.WARNING)
    for message in (r"Please use DTensor instead", r".*is deprecated. Please use", r"`load_state_dict` is deprecated",
                    r"The \.grad attribute of a Tensor that is not a leaf", r".*TorchDistLoadShardedStrategy",
                    r".*tensor\.detach\(\) first"):
        warnings.filterwarnings("ignore", message=message)


def quiet_import():
    """megatron-core warns at import that transformer-engine and apex are missing (expected here)."""
    import warnings

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex) (and Apex )?(is|are) not installed.*")
    warnings.filterwarnings("ignore", message=r".*full scope is deprecated.*")
    return stack
