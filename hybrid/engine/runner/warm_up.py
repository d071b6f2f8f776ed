"""The model runner's warm-up: every kernel variant a step can need compiled before the first
request (a variant first compiled while serving costs some request a pause of seconds).

Order, for a first start whose CPU experts' kernels still compile in background processes:
1. where Triton can (gpu_kernels.precompile), a dry run of the GPU-only work below (the
   streamed experts' grouped launches, the steps with routed experts left out, the GPU-held
   experts' block sizes) records the variants they need, and threads compile them from then on;
2. the steps that stream every MoE layer's experts (no CPU kernel; their routing is the
   device's, so no dry run) run meanwhile, compiling their own;
3. the GPU-only work for real, the pool joined first: it compiles nothing more;
4. `cpu_kernels_ready` (the wait for the background compile), then the steps with the CPU
   experts.
Every step writes only the cache's scratch slot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from hybrid.engine.prefill import prefill_setup
from hybrid.engine.step.forward_batch import ForwardBatch, StepLayout
from hybrid.engine.step.step_state import StepState
from hybrid.ops.experts import ExpertsOp

log = logging.getLogger("hybrid.engine")


@torch.inference_mode()
def warm_up(runner, progress: Callable[[str], None] | None = None,
            decode: bool = False, cpu_kernels_ready: Callable[[], None] = lambda: None) -> None:
    """Compile every kernel variant a step can need: the streamed experts' grouped launches
    at every block size, a prefill-shaped step of each token-count class of the product
    kernels' tiles (and of chunk_size), every row sampling up to the largest class (the
    head's products take those counts too), and a decode-shaped step of each graph bucket
    (with `decode` the 1-row one also with the CPU experts: without CUDA graphs, whose capture
    does that). Where runner.config.compile_threads (default: one a core; the compiler mostly
    waits on ptxas and its passes run outside the GIL) is above 1, the GPU-only work's variants
    compile ahead on that many threads where Triton can (the module's order)."""
    from gpu_kernels.qmatmul import TOKEN_CLASSES
    from hybrid.engine.graphs.decode_graphs import bucket_sizes

    largest = TOKEN_CLASSES[-1]
    counts = sorted({min(n, runner.max_tokens) for n in (*TOKEN_CLASSES,
                                                       runner.chunk_size)})
    layers = len(runner.program.moe_layers)

    def streams(n: int) -> bool:
        # steps past the product classes stream where they can (as served: the CPU
        # experts add no kernel variant, and cost seconds at chunk_size tokens)
        return runner.stream is not None and n > largest and layers > 0

    def prefill(n: int, **state) -> None:
        fb = ForwardBatch.scratch_prefill(n, runner.page_size, runner.cache, runner.device,
                                          samples=n if n <= largest else 1)
        runner.program.run(StepState(fb, num_real=n, **state))

    def decode_step(b: int, **state) -> None:
        _, fb = ForwardBatch.scratch_decode(StepLayout(b, b, runner.max_pages, b),
                                            runner.page_size, runner.cache, runner.device)
        runner.attention.prepare(fb)
        runner.program.run(StepState(fb, num_real=b, **state))

    on_cpu = [n for n in counts if not streams(n)]
    steps = len(counts)

    def device_only() -> None:
        """The work whose kernels are the GPU's alone, its indices made on the host."""
        if runner.stream is not None:  # every block size the streamed layers' launches pick
            prefill_setup.warm_up(runner.stream, runner.program.moe_layers[0],
                                  runner.model.config.hidden_size)
        if layers:
            for n in on_cpu:
                prefill(n, routed_off=True)
            for b in bucket_sizes(runner.config.max_batch_size):
                decode_step(b, routed_off=True)
        for op in runner.model.modules():
            # on-device and GPU-held experts: block sizes no step picks (the steps above
            # left every routed expert out, held ones too)
            if isinstance(op, ExpertsOp):
                op.warm_up()

    threads = runner.config.compile_threads or os.cpu_count() or 1
    pool = _precompile(runner, device_only, threads, progress) if threads > 1 else None
    try:
        for i, n in enumerate(n for n in counts if streams(n)):
            if progress is not None:
                progress(f"compiling kernels: a step of {n} tokens ({i + 1}/{steps})")
            runner.stream.begin(range(layers))
            prefill(n, streamed=frozenset(range(layers)))
    except BaseException:
        if pool is not None:
            pool.cancel()
        raise
    if pool is not None:
        pool.wait()
    if layers and progress is not None:
        progress(f"compiling kernels: steps of {', '.join(map(str, on_cpu))} tokens and "
                 f"decode steps, the CPU experts left out")
    device_only()
    cpu_kernels_ready()
    for i, n in enumerate(on_cpu, start=len(counts) - len(on_cpu)):
        if progress is not None:
            progress(f"compiling kernels: a step of {n} tokens ({i + 1}/{steps})")
        prefill(n)
    if decode:
        decode_step(1)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def _precompile(runner, work: Callable[[], None], threads: int,
                progress: Callable[[str], None] | None):
    """A dry run of `work` recording the Triton variants it needs, then a pool compiling them
    (precompile.Precompile), or None where Triton cannot or the run records the routing
    (the recorder reads the router's ids, which a dry run leaves garbage)."""
    from gpu_kernels import precompile

    if not precompile.available(runner.device) or runner.program.recorder is not None:
        return None
    if progress is not None:
        progress("compiling kernels: a dry run of the GPU's own steps records their variants")
    with precompile.recording() as recorded:
        try:
            work()
        except Exception as e:  # noqa: BLE001 - the real run after it compiles one by one
            log.warning("a dry run to compile kernels ahead failed (%s); they compile one by "
                        "one", e)
    if not recorded:
        return None
    if progress is not None:
        progress(f"compiling kernels: {len(recorded)} variants on {threads} threads")
    return precompile.Precompile(recorded, threads)
