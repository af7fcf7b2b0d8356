"""A CUDA GPU simulated on the CPU, to test without a GPU that every pass keeps its tensors on the model's device.

Inside ``simulated_cuda()``:

- ``torch.cuda.is_available()`` is True and the few ``torch.cuda`` calls the project makes answer as a large GPU;
- a tensor moved or made "on cuda" (``.to("cuda")``, ``.cuda()``, ``device="cuda"``, ``model.to("cuda")``) is an
  ``OnCuda``: its numbers are on the CPU, but it says it is on ``cuda:0`` and behaves as a CUDA tensor would where
  devices matter:
  - an operation mixing it with a CPU tensor of one or more dimensions raises PyTorch's "Expected all tensors to be
    on the same device" (a CPU scalar mixes, as on a GPU; ``copy_`` and indexing with CPU indices are allowed);
  - ``.numpy()`` and ``np.asarray`` of it raise, as for a CUDA tensor;
  - ``.cpu()`` and ``.to("cpu")`` give a plain CPU tensor, counted in ``SimulatedCuda.copies`` with ``.item``,
    ``.tolist`` and ``float()``/``int()``/``bool()``, which read a GPU tensor through the host.

It is not a GPU: no speed, no memory figures, no CUDA kernels. A bug it finds is a real one (a pass that would
raise on a GPU); a pass it runs is one that a GPU runs without device errors.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

_OWN = tuple(f"{Path(__file__).resolve().parents[1] / part}/" for part in ("model_core", "attention_explorer", "ui",
                                                                           "pages"))
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
_T = torch.Tensor
# Operations that may mix devices on a GPU: copies between devices, and indexing a CUDA tensor with CPU indices.
_MIXING = {_T.copy_, _T.to, _T.cpu, _T.cuda, torch._has_compatible_shallow_copy_type, _T.set_, _T.data.__set__,
           torch.utils.swap_tensors}
# Where a CUDA GPU refuses a CPU scalar (a 0-dim tensor) that element-wise operations take (checked on an H200).
_NO_CPU_SCALAR = {"stack", "cat", "concat", "concatenate", "hstack", "vstack", "index_select", "gather", "take",
                  "clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_max", "matmul", "mm", "bmm", "einsum"}
# Reads of a GPU tensor through the host (allowed, counted).
_READS = {_T.item: "item", _T.tolist: "tolist", _T.__float__: "__float__", _T.__int__: "__int__",
          _T.__bool__: "__bool__", _T.__index__: "__index__"}
_NO_NUMPY = {_T.numpy, _T.__array__}


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, int):  # .to(0), .cuda(0)
        return True
    return isinstance(device, torch.device) and device.type == "cuda"


class OnCuda(torch.Tensor):
    """A CPU tensor standing for one on ``cuda:0`` (see the module's docstring)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        getter = _getter(func)
        if getter in _PROPERTIES:
            return _PROPERTIES[getter]
        if getter == "grad":  # autograd computes on the numbers: the gradient of a CUDA tensor is on CUDA
            grad = super().__torch_function__(func, types, args, kwargs)
            return grad if grad is None or isinstance(grad, OnCuda) else grad.as_subclass(OnCuda)
        if func is _T.numpy and kwargs.get("force"):  # numpy(force=True) copies a CUDA tensor to the host
            SIM.count("numpy")
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func in _NO_NUMPY:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func in _READS:
            SIM.count(_READS[func])
        elif func is _T.cpu or (func is _T.to and _target_cpu(args[1:], kwargs)):
            SIM.count("cpu")
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            return out.as_subclass(torch.Tensor) if type(out) is not torch.Tensor else out.clone()
        elif func not in _MIXING:
            _check_devices(func, args, kwargs)
        return super().__torch_function__(func, types, args, kwargs)


_PROPERTIES = {"device": CUDA, "is_cuda": True, "is_cpu": False}


def _getter(func) -> str | None:
    """The attribute a property getter reads (``x.device`` reaches ``__torch_function__`` as its ``__get__``)."""
    if getattr(func, "__name__", "") == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", None)
    return None


def _target_cpu(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, str):
        return torch.device(target).type == "cpu"
    if isinstance(target, torch.device):
        return target.type == "cpu"
    if isinstance(target, torch.Tensor):
        return not isinstance(target, OnCuda)
    return False


def _check_devices(func, args, kwargs) -> None:
    """Raise as CUDA does where an operation mixes a CUDA tensor with a CPU one. A CPU scalar (0-dim) mixes in
    element-wise operations only, never as the target of an in-place one; indexing takes CPU indices on a CUDA
    tensor, not CUDA indices on a CPU one, and an indexed assignment copies no other device's values."""
    name = getattr(func, "__name__", "")
    flat, _ = tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    if not any(isinstance(t, OnCuda) for t in tensors):
        return
    host = [t for t in tensors if not isinstance(t, OnCuda) and t.device.type == "cpu"]
    first = args[0] if args else None
    if func in (_T.__getitem__, _T.__setitem__):
        index = tree_flatten(args[1])[0] if len(args) > 1 else []
        value = args[2] if len(args) > 2 else None
        advanced = any(isinstance(i, torch.Tensor) for i in index)
        mixed = (not isinstance(first, OnCuda) and any(isinstance(i, OnCuda) for i in index)) or (
            advanced and isinstance(value, torch.Tensor) and value.dim() > 0
            and isinstance(value, OnCuda) != isinstance(first, OnCuda))
    elif name.endswith("_") and isinstance(first, torch.Tensor) and not isinstance(first, OnCuda):
        mixed = True  # an in-place operation on a CPU tensor with a CUDA operand
    else:
        mixed = any(t.dim() > 0 or name in _NO_CPU_SCALAR for t in host)
    if mixed:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
                           f"and cpu! (simulated GPU: {getattr(func, '__qualname__', name)})")


def _on_cuda(value: Any) -> Any:
    return tree_map(lambda t: t.as_subclass(OnCuda) if type(t) is torch.Tensor else t, value)


class _Mode(TorchFunctionMode):
    """Factories and moves that name CUDA make an ``OnCuda`` (their numbers made on the CPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (_T.to, _T.cuda) and args and isinstance(args[0], torch.Tensor):
            rest = list(args[1:])
            if func is _T.cuda or _is_cuda(kwargs.get("device", rest[0] if rest else None)):
                if func is _T.cuda:
                    out = args[0]
                else:
                    if "device" in kwargs:
                        kwargs["device"] = CPU
                    else:
                        rest[0] = CPU
                    with torch._C.DisableTorchFunctionSubclass():  # a CUDA tensor moved to CUDA is not a copy
                        out = func(args[0], *rest, **kwargs)
                return out if isinstance(out, OnCuda) else out.as_subclass(OnCuda)
            return func(*args, **kwargs)
        if func is torch.autograd.grad:  # the gradients of CUDA tensors are on CUDA
            return _on_cuda(func(*args, **kwargs))
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = CPU
            return _on_cuda(func(*args, **kwargs))
        return func(*args, **kwargs)


_MODULE_TO = torch.nn.Module.to
_THREAD_RUN = threading.Thread.run


def _run_simulated(thread: threading.Thread) -> None:
    with _Mode():
        _THREAD_RUN(thread)


def _module_to(module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """``Module.to``: to CUDA, every parameter and buffer becomes an ``OnCuda`` (tied ones stay one object)."""
    target = kwargs.get("device", args[0] if args else None)
    if not _is_cuda(target):
        return _MODULE_TO(module, *args, **kwargs)
    rest = {k: v for k, v in kwargs.items() if k != "device"}
    _MODULE_TO(module, *(() if "device" in kwargs else args[1:]), **rest)  # a dtype, if any
    moved: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is None or isinstance(p, OnCuda):
                continue
            if id(p) not in moved:  # the same object now on "cuda", as model.to keeps a parameter's identity
                new = torch.nn.Parameter(p.data.as_subclass(OnCuda), p.requires_grad)
                try:
                    torch.utils.swap_tensors(p, new)
                    new = p
                except RuntimeError:  # a view of it is held: that view stays on the CPU, as on a GPU
                    pass
                moved[id(p)] = new
            sub._parameters[name] = moved[id(p)]
        for name, b in list(sub._buffers.items()):
            if b is not None and not isinstance(b, OnCuda):
                sub._buffers[name] = moved.setdefault(id(b), b.as_subclass(OnCuda))
    return module


class SimulatedCuda:
    """What a simulated run counted: ``copies`` (kind -> reads of a GPU tensor through the host) and ``where``
    ((file, function) of the project's code that made each -> count)."""

    def __init__(self) -> None:
        self.copies: Counter = Counter()
        self.where: Counter = Counter()

    def count(self, kind: str) -> None:
        self.copies[kind] += 1
        frame = sys._getframe(2)
        while frame is not None and not frame.f_code.co_filename.startswith(_OWN):
            frame = frame.f_back
        if frame is not None:
            self.where[(Path(frame.f_code.co_filename).name, frame.f_code.co_name)] += 1


SIM = SimulatedCuda()


class _Props:
    name = "Simulated GPU"
    total_memory = 80 * 2**30
    major, minor = 9, 0
    multi_processor_count = 132


@contextlib.contextmanager
def simulated_cuda() -> Iterator[SimulatedCuda]:
    """Run the block with a simulated CUDA GPU (see the module's docstring)."""
    global SIM
    SIM = SimulatedCuda()
    free = 70 * 2**30
    patches = [
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.device_count", return_value=1),
        mock.patch("torch.cuda.current_device", return_value=0),
        mock.patch("torch.cuda.mem_get_info", return_value=(free, _Props.total_memory)),
        mock.patch("torch.cuda.get_device_name", return_value=_Props.name),
        mock.patch("torch.cuda.get_device_properties", return_value=_Props()),
        mock.patch("torch.cuda.is_bf16_supported", return_value=True),
        mock.patch("torch.cuda.synchronize", return_value=None),
        mock.patch("torch.cuda.empty_cache", return_value=None),
        mock.patch("torch.cuda.memory_allocated", return_value=0),
        mock.patch("torch.cuda.max_memory_allocated", return_value=0),
        mock.patch("torch.cuda.reset_peak_memory_stats", return_value=None),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(mock.patch.object(torch.nn.Module, "to", _module_to))
        stack.enter_context(mock.patch.object(torch.nn.Module, "cuda", lambda self, device=None: _module_to(self, CUDA)))
        stack.enter_context(_Mode())
        # torch's function modes are per thread: a thread started inside (a Streamlit script run, a page's worker)
        # runs under its own
        stack.enter_context(mock.patch.object(threading.Thread, "run", _run_simulated))
        yield SIM


def on_cuda(fn):
    """Decorate a test to run it under ``simulated_cuda()``."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with simulated_cuda():
            return fn(*args, **kwargs)
    return wrapper
