"""Host counters: what one call asks of the host (ATen ops dispatched, GPU kernels launched, host-device
synchronisations, bytes allocated), counted in one untimed call: exact, whatever the load; and the access to
``torch.profiler``'s raw events that the counters, the kernel traces and the CUPTI device time share.

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar

_Mode = TypeVar("_Mode", bound=type)


def without_dynamo_import(mode: _Mode) -> _Mode:
    """A ``TorchDispatchMode`` subclass whose ``__torch_dispatch__`` does not import ``torch._dynamo``.

    torch wraps a subclass's ``__torch_dispatch__`` in ``torch._disable_dynamo``, whose first call imports
    ``torch._dynamo``: 2.5 s of a fresh process on 2 cores, paid by every recording process that traces or
    counts a torch call. The wrapper keeps Dynamo from compiling the mode's own frames. Where Dynamo was never
    imported nothing compiles, and the mode's own function runs; once it is imported, the wrapper runs as torch
    made it."""
    wrapped = mode.__dict__["__torch_dispatch__"]
    raw = getattr(wrapped, "__wrapped__", None)
    if raw is None:  # a torch that does not wrap it
        return mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "torch._dynamo" in sys.modules:
            return wrapped(self, func, types, args, kwargs)
        return raw(self, func, types, args, kwargs)

    mode.__torch_dispatch__ = __torch_dispatch__  # type: ignore[attr-defined]
    return mode


# ---------------------------------------------------------------------------------------- host counters
#: ``torch.profiler`` runtime events that make the host wait for the device
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def host_counters(call: Callable[[], object], device: str) -> dict[str, Any]:
    """What one call of ``call`` (which must *not* synchronise) asks of the host, counted in one untimed call.

    ``aten_ops``: ATen ops dispatched below autograd (a ``TorchDispatchMode``, which autograd propagates to
    its backward threads); ``alloc_bytes``: on CUDA the caching allocator's ``allocated_bytes`` growth
    during the call (workspaces included), on the CPU the bytes of the fresh storages the ops return (the
    mode sees each op's outputs; views and in-place results, which allocate nothing, are not counted);
    ``kernels`` and ``syncs`` (CUDA only; 0 on the CPU, which launches no GPU work): GPU kernels launched and
    host-device synchronisations (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
    ``cudaEventSynchronize``, ``cudaMemcpy`` runtime calls) seen by ``torch.profiler``. Counts are exact
    and do not depend on the machine's load; the caller counts after warm-up, never during timed rounds.
    """
    import torch

    cuda = device.startswith("cuda")
    counter = _OpCounter()
    profiler = None
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize(device)
        # CPU and GPU activity, as every baseline was counted: with GPU activity alone the count is faster
        # (a cuDNN-off LSTM forward on the H100: 0.10 s against 0.18 s) but an optimizer step counts one
        # kernel fewer (SGD.step: 1 against 2, deterministic), so a clean run would fail the exact kernel
        # comparison against a baseline counted the other way
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        before = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
    with contextlib.ExitStack() as stack:
        if profiler is not None:
            stack.enter_context(profiler)
        stack.enter_context(_counting_mode(counter, fresh_bytes=not cuda))
        call()
        if cuda:
            torch.cuda.synchronize(device)
    out = {"aten_ops": counter.ops, "kernels": 0, "syncs": 0, "alloc_bytes": counter.fresh_bytes}
    if profiler is not None:
        kernels = syncs = 0
        for name, on_gpu in profiled_events(profiler):
            if on_gpu:
                kernels += not name.startswith(("Memcpy", "Memset"))  # copies and fills are no launches
            elif name.split("_v")[0] in SYNC_EVENTS:  # runtime names may carry a version suffix
                syncs += 1
        after = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
        # the synchronisation that closes the counted call is ours, not the call's
        out.update(kernels=kernels, syncs=max(0, syncs - 1), alloc_bytes=int(after - before))
    return out


class _OpCounter:
    def __init__(self) -> None:
        self.ops = 0
        self.fresh_bytes = 0


@contextlib.contextmanager
def _counting_mode(counter: _OpCounter, fresh_bytes: bool = True) -> Any:
    """Count the ATen ops dispatched under it and, with ``fresh_bytes`` (the CPU, where no allocator counts
    them), the bytes of the fresh storages they return. Without it (CUDA: the caching allocator counts the
    bytes) an op is only counted: walking every op's inputs and outputs cost 20 us per op, 0.2 s of the
    count of a Keras generic training step of 11,000 ops."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    @without_dynamo_import
    class Counted(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            counter.ops += 1
            return func(*args, **(kwargs or {}))

    if not fresh_bytes:
        with Counted():
            yield
        return

    @without_dynamo_import
    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            inputs = {
                t.untyped_storage().data_ptr()
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and not t.is_meta
            }
            result = func(*args, **kwargs)
            counter.ops += 1
            seen: set[int] = set()
            for t in tree_leaves(result):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                    if ptr and ptr not in inputs and ptr not in seen:
                        seen.add(ptr)
                        counter.fresh_bytes += storage.nbytes()
            return result

    with Counting():
        yield


# ------------------------------------------------------------------------------------------- profiler
def profiled_events(profiler: object) -> list[tuple[str, bool]]:
    """``(name, on_gpu)`` of every event a finished ``torch.profiler.profile`` recorded, read from the raw
    results: building torch's ``FunctionEvent`` list (``profiler.events()``) costs seconds for a call with
    tens of thousands of ops (a Keras loop over 100 steps), reading the raw events a few milliseconds.
    Names are demangled as ``events()`` demangles them."""
    import torch

    try:
        raw = profiler.profiler.kineto_results.events()  # type: ignore[attr-defined]
    except AttributeError:  # another profiler implementation: the slow, documented way
        return [(e.name, "CUDA" in str(getattr(e, "device_type", ""))) for e in profiler.events()]  # type: ignore[attr-defined]
    from torch.autograd import DeviceType

    cuda = DeviceType.CUDA  # compared, not printed: str() of the enum took 3x the time of the rest per event
    names: dict[str, str] = {}
    out = []
    for event in raw:
        if getattr(event, "is_hidden_event", lambda: False)():  # as events() skips them
            continue
        name = event.name()
        if name not in names:
            names[name] = torch._C._demangle(name) if len(name) > 1 else name
        out.append((names[name], event.device_type() == cuda))
    return out


def cuda_profile(block: Callable[[], object]) -> Any | None:
    """``block`` run under ``torch.profiler`` recording CUDA activity alone: CUPTI records every GPU activity of
    the process, whichever runtime launched it (XLA's too). The finished profiler, or None, ``block`` not run,
    where torch has no CUDA profiling."""
    try:
        from torch.profiler import ProfilerActivity, profile, supported_activities
    except ImportError:
        return None
    if ProfilerActivity.CUDA not in supported_activities():
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        block()
    return prof
