"""The model runner's decode graphs at start-up: which form can be captured (graph_form), the
faster form timed where the config leaves it open (measure, choice.py's timing), and the capture
of every batch bucket (capture). Each function takes the ModelRunner being started (untyped:
this sits below it)."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

from hybrid.errors import is_device_lost

log = logging.getLogger("hybrid.engine")


def graph_form(runner, decode_graph: str, progress: Callable[[str], None] | None
               ) -> str | None:
    """The decode graphs' form that can be captured ("step", "layers", or "auto": time both),
    or None where decode steps run eagerly. A model over several GPUs takes "layers": a graph
    per piece on its GPU, which needs every piece on one GPU (graphs/piecewise.py)."""
    program = runner.program
    if runner.device.type != "cuda" or not program.can_capture:
        return None
    if not program.spans_devices:  # every operator of the step on the model's GPU
        return decode_graph
    why = None
    if not all(d.type == "cuda" for d in program.devices):
        why = "some of the layers' work runs on the CPU"
    elif not program.pieces_on_one_device:
        why = "a stretch between two MoE layers' CPU experts mixes devices"
    if why is not None:
        line = (f"decode steps run eagerly: the model runs on "
                f"{', '.join(map(str, program.devices))} and {why} (a CUDA graph captures one)")
        if progress is not None:
            progress(line)
        else:
            log.info("%s", line)
        return None
    if progress is not None:
        progress(f"the layers run on {', '.join(map(str, program.devices))}: decode steps "
                 f"replay a graph per stretch of layers on its GPU (one graph cannot span GPUs)")
    return "layers"


def measure(runner, progress: Callable[[str], None] | None) -> tuple[str, float | None]:
    """graphs/choice.py: the faster form of decode graphs here ("step" where no MoE layer's
    experts are on the CPU: the forms are then the same graphs; also where the timing itself
    fails short of a lost device, said in a warning: the choice is an optimization, and the
    capture that follows meets any real fault again) -> (that form, its ms a one-token step,
    or None where nothing was timed)."""
    from hybrid.engine.graphs import choice as graph_choice

    if not runner.program.moe_layers:
        return "step", None
    if progress is not None:
        progress("timing decode steps as one graph against layer by layer")
    try:
        seconds = graph_choice.measure(
            lambda form: capture(runner, form, max_batch_size=1), runner.device)
    except Exception as e:
        if is_device_lost(e):
            raise
        log.warning("timing the decode graphs failed (%s: %s); decode steps run as one graph",
                    type(e).__name__, e)
        return "step", None
    chosen = graph_choice.faster(seconds)
    line = graph_choice.describe(seconds, chosen)
    if progress is not None:
        progress(line)
    else:
        log.info("%s", line)
    return chosen, 1e3 * statistics.median(seconds[chosen])


def capture(runner, decode_graph: str, progress: Callable[[str], None] | None = None,
            max_batch_size: int | None = None):
    """-> DecodeGraphs of every batch bucket up to `max_batch_size` (the config's when
    None), `decode_graph` "step" or "layers" (also for benchmarks that compare the two in
    one process)."""
    from hybrid.engine.graphs.decode_graphs import DecodeGraphs

    return DecodeGraphs(runner.program, runner.cache, runner.page_size, runner.max_pages,
                        max_batch_size or runner.config.max_batch_size, runner.device,
                        runner.attention, runner.carried_ids, progress,
                        whole_step=decode_graph == "step" and bool(runner.program.moe_layers))
