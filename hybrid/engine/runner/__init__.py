"""The model runner: `ModelRunner.run(batch) -> StepResult`, one step on the device and the
CPU experts, and its start-up (warm-up, graph capture, the cost model)."""
