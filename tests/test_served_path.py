"""`hybrid serve` as users start it (a process, the engine on its main thread, HTTP on another),
the served-vs-engine benchmark at a CPU size, and the prefill chunk chosen at start-up."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hybrid.model.activations import (
    CPU_CHUNK,
    STREAM_CHUNK,
    ModelShapes,
    activation_bytes_per_token,
    choose_chunk_size,
)

from .subprocess_env import with_checkout

ROOT = Path(__file__).resolve().parents[1]


def _start_serve(path: Path, *flags: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`hybrid serve` as a process on a free port -> (process, base URL, start-up lines)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--gguf-path", str(path),
         "--optimize-rules", "cpu", "--port", "0", "--log-level", "warning", *flags],
        cwd=ROOT, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 300
    while True:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "serve exited: " + "".join(lines)
        assert time.monotonic() < deadline, "serve did not start"
        lines.append(line)
        if (m := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)) is not None:
            break
    url = m.group(1)
    for _ in range(100):  # uvicorn's thread may still be starting
        try:
            httpx.get(f"{url}/health", timeout=5)
            break
        except httpx.ConnectError:
            time.sleep(0.1)
    return proc, url, lines


def _kill(proc: subprocess.Popen) -> None:
    """A test's server that has not exited by itself (a failed assertion) goes now."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_serve_process_answers_then_exits_cleanly_on_sigterm(models) -> None:
    """The engine steps on the main thread: requests are answered, and SIGTERM ends the process
    with exit 0 (uvicorn's thread and the engine's loop both stop) and no teardown noise."""
    path = models.path("tiny-v3", "q4_k_m")
    proc, url, lines = _start_serve(path, "--log-level", "info")
    try:
        # no GPU: 512; said once (the library's log line repeated it at the info level)
        assert sum("up to 512 tokens (no streamed experts" in x for x in lines) == 1
        r = httpx.post(f"{url}/v1/completions", json={
            "model": path.stem, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "leaked" not in err
    finally:
        _kill(proc)


def test_sigterm_drains_running_requests_and_refuses_new_ones(models) -> None:
    """SIGTERM while a stream runs: new requests (and /health) get a 503 with Retry-After, the
    stream runs to its end, then the process exits 0."""
    path = models.path("tiny-v3", "q4_k_m")
    proc, url, _ = _start_serve(path, "--shutdown-timeout", "120")
    try:
        body = {"model": path.stem, "prompt": [1, 2, 3], "max_tokens": 48, "temperature": 0,
                "ignore_eos": True, "stream": True, "logprobs": 0}  # a chunk every token
        texts, refused = [], []
        with httpx.Client(timeout=120) as client, \
                client.stream("POST", f"{url}/v1/completions", json=body) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data: {"):
                    continue
                texts.append(json.loads(line[6:])["choices"][0])
                if len(texts) == 2:
                    proc.send_signal(signal.SIGTERM)
                    time.sleep(0.2)  # the handler runs between two steps
                    with httpx.Client(timeout=30) as other:  # a connection of its own
                        refused.append(other.post(f"{url}/v1/completions", json={
                            **body, "stream": False}))
                        refused.append(other.get(f"{url}/health"))
        assert len(texts) == 48 and texts[-1]["finish_reason"] == "length"
        assert [r.status_code for r in refused] == [503, 503]
        assert refused[0].headers["retry-after"] == "10"
        assert refused[0].json()["error"]["code"] == "server_shutting_down"
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "shutting down: admitting nothing more, finishing 1 running" in err
    finally:
        _kill(proc)


def test_sigterm_cancels_what_outlasts_the_shutdown_timeout(models) -> None:
    path = models.path("tiny-v3", "q4_k_m")
    proc, url, _ = _start_serve(path, "--shutdown-timeout", "0.5")
    try:
        body = {"model": path.stem, "prompt": [1, 2, 3], "max_tokens": 2000, "temperature": 0,
                "ignore_eos": True, "stream": True, "logprobs": 0}
        tokens = 0
        with httpx.Client(timeout=120) as client, \
                client.stream("POST", f"{url}/v1/completions", json=body) as stream:
            try:
                for line in stream.iter_lines():
                    tokens += line.startswith("data: {")
                    if tokens == 2:
                        proc.send_signal(signal.SIGTERM)
            except httpx.HTTPError:
                pass  # the stream is cut when its request is cancelled
        assert 2 <= tokens < 2000
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "cancelling the requests still running after 0 s" in err
    finally:
        _kill(proc)


def test_bench_served_decode_reports_every_row(tmp_path, models) -> None:
    """The CPU-sized served-vs-engine ratio: offline, engine, HTTP and chat rows, one run."""
    out = tmp_path / "rows.json"
    env = with_checkout(ROOT)
    subprocess.run([sys.executable, "scripts/bench_served_decode.py", "--gguf-path",
                    str(models.path("tiny-v3", "q4_k_m")), "--optimize-rules", "cpu",
                    "--gen-len", "6", "--repeats", "1", "--ttft", "40", "--mixed", "40",
                    "--json", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())
    assert set(rows["median_tokens_per_s"]) == {"offline", "engine", "http", "http+chat"}
    assert all(v > 0 for v in rows["median_tokens_per_s"].values())
    assert rows["ratio_http"] > 0 and rows["ttft_s"]["40"] > 0
    assert rows["engine_thread"] == "main"
    mixed = rows["mixed"]  # a prompt arriving while a stream decodes: its tokens as alone
    assert mixed["ttft_s"] > 0 and len(mixed["runs"]) == 1
    assert mixed["same_first_token"] and mixed["same_stream_tokens"]


V2_LITE = ModelShapes(hidden_size=2048, num_attention_heads=16, qk_head_dim=192, v_head_dim=128,
                      kv_lora_rank=512, intermediate_size=10944, moe_intermediate_size=1408,
                      num_experts_per_tok=6)


def test_activation_bytes_count_the_largest_layer_part() -> None:
    # V2-Lite: the routed experts' 6 x (3 x 1408 + 2048) floats outweigh the dense MLP's
    # 3 x 10944 and attention's 16 x 640 + 512; plus 4 x 2048 across layers (179 KiB)
    assert activation_bytes_per_token(V2_LITE) == 4 * (4 * 2048 + 6 * (3 * 1408 + 2048))
    v3 = ModelShapes(7168, 128, 192, 128, 512, 18432, 2048, 8)  # the routed experts' rows
    assert activation_bytes_per_token(v3) == 4 * (4 * 7168 + 8 * (3 * 2048 + 7168))
    many_heads = ModelShapes(7168, 256, 192, 128, 512, 18432, 2048, 8)  # attention's heads
    assert activation_bytes_per_token(many_heads) == 4 * (4 * 7168 + 256 * 640 + 512)


@pytest.mark.parametrize("can_stream,free_gib,max_request,expected", [
    (False, 80, 32768, CPU_CHUNK),  # the CPU experts only: 512 whatever the memory
    (True, 80, 32768, STREAM_CHUNK),  # room for the largest chunk
    (True, 80, 3000, 2816),  # no more than a request holds, in whole 256-token steps
    (True, 2, 32768, 2816),  # a quarter of 2 GiB at 179 KiB a token: 2928, in 256s
    (True, 0.1, 32768, CPU_CHUNK),  # short of memory: never below 512
])
def test_chunk_size_follows_streaming_and_memory(can_stream: bool, free_gib: float,
                                                max_request: int, expected: int) -> None:
    per_token = activation_bytes_per_token(V2_LITE)
    assert choose_chunk_size(can_stream, per_token, int(free_gib * 2**30), max_request) \
        == expected


def test_engine_takes_the_given_chunk_size_or_chooses_one(models) -> None:
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v3", "q4_k_m"))
    chosen = LLM(path, "cpu", engine_config=EngineConfig(cache_lens=1024)).engine
    given = LLM(path, "cpu", engine_config=EngineConfig(chunk_size=96, cache_lens=1024)).engine
    assert (chosen.runner.chunk_size, chosen.scheduler.chunk_size) == (CPU_CHUNK, CPU_CHUNK)
    assert (given.runner.chunk_size, given.scheduler.chunk_size) == (96, 96)


def _placement(stream_ms, cpu_ms, layers: int = 4, nbytes: int = 1000, mode: str = "auto"):
    from hybrid.engine.prefill.prefill_costs import ExpertPlacement, PrefillCosts

    costs = PrefillCosts(nbytes, tuple(stream_ms), tuple(cpu_ms)) if stream_ms else None
    return ExpertPlacement(mode, (nbytes,) * layers, costs)


def test_decode_chunk_keeps_one_streamed_layer_within_two_decode_steps() -> None:
    from hybrid.engine.prefill.prefill_chunk import choose_decode_chunk_size

    # a decode step's CPU experts: 4 layers x 2 ms = 8 ms; budget 16 ms a streamed layer.
    # Streamed: 6 ms up to 2048 tokens, then proportional: 16 ms at 5461 tokens -> 5376.
    p = _placement([(128, 6.0), (2048, 6.0)], [(1, 2.0), (256, 40.0)])
    assert choose_decode_chunk_size(p, 8192, 4, 2.0) == 5376
    assert choose_decode_chunk_size(p, 4096, 4, 2.0) == 4096  # never above the chunk
    # the budget below the fewest streaming tokens: that count (rounded up to 256)
    # (the CPU's 0.5 ms at 1 token to 40 at 1024 passes the streamed 30 ms at 769 tokens)
    slow = _placement([(128, 30.0), (2048, 30.0)], [(1, 0.5), (1024, 40.0)])
    assert choose_decode_chunk_size(slow, 8192, 4, 2.0) == 768


def test_decode_chunk_without_measurements() -> None:
    from hybrid.engine.prefill.prefill_chunk import choose_decode_chunk_size

    assert choose_decode_chunk_size(_placement(None, None, mode="cpu"), 512, 4, 2.0) == 512
    assert choose_decode_chunk_size(_placement(None, None, mode="stream"), 8192, 4, 2.0) == 2048
    assert choose_decode_chunk_size(_placement(None, None, layers=0), 8192, 0, 2.0) == CPU_CHUNK
    # streaming never wins up to the chunk: the chunk's experts run on the CPU, 512 a step
    never = _placement([(128, 50.0), (2048, 500.0)], [(1, 1.0), (256, 10.0)])
    assert choose_decode_chunk_size(never, 8192, 4, 2.0) == CPU_CHUNK


def test_bench_serve_peer_measures_hybrid_as_users_start_it(tmp_path, models) -> None:
    """The peer benchmark's client half (the official openai client) on `hybrid serve` started
    with its defaults: every row is there (the peer's rows need llama-server: GPU machine)."""
    out = tmp_path / "peer.json"
    env = with_checkout(ROOT)
    subprocess.run([sys.executable, "scripts/bench_serve_peer.py", "--gguf-path",
                    str(models.path("tiny-v3", "q4_k_m")), "--ttft", "40", "--streams", "2",
                    "--gen-len", "4", "--rates", "4", "--requests", "3", "--json", str(out),
                    "--logs", str(tmp_path)],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())
    ours = rows["hybrid"]
    assert rows["peer"] is None and ours["startup_s"] > 0 and ours["decode_tok_s"] > 0
    assert ours["ttft_s"]["40"] > 0 and ours["aggregate_tok_s"]["2"] > 0
    # the rows are medians of --repeats (3) samples, kept beside them
    assert len(ours["decode_samples"]) == len(ours["aggregate_samples"]["2"]) == 3
    assert ours["decode_tok_s"] == sorted(ours["decode_samples"])[1]
    mixed = ours["mixed"]["4.0"]
    assert mixed["requests"] == 3 and 0 <= mixed["goodput_req_s"] and mixed["ttft_p99_s"] > 0


def test_probe_decode_host_accounts_for_every_step(tmp_path, models) -> None:
    """scripts/probe_decode_host.py at a CPU size: each step's phases add up to the step (they
    are consecutive stretches of one clock), and its greedy tokens are the engine's."""
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams

    out, path = tmp_path / "probe.json", str(models.path("tiny-v3", "q4_k_m"))
    env = with_checkout(ROOT)
    subprocess.run([sys.executable, "scripts/probe_decode_host.py", "--gguf-path", path,
                    "--optimize-rules", "cpu", "--gen-len", "14", "--prompt-len", "5",
                    "--json", str(out)], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=600)
    rows = json.loads(out.read_text())["runs"]["rules"]  # one run, the rules' own deferral
    assert len(rows["steps"]) == 14 - 8 - 1  # after the warm steps, the last one left out
    for step in rows["steps"]:
        parts = sum(v for k, v in step.items() if k not in ("step", "period"))
        assert step["forward"] > 0 and abs(parts - step["step"]) < 1.0  # us
        assert step["period"] >= step["step"]  # the next step starts after this one ends
    prompt = [(7 * i + 3) % 1000 + 10 for i in range(5)]  # the probe's prompt
    llm = LLM(path, "cpu", engine_config=EngineConfig())
    want = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=14, ignore_eos=True))[0].outputs[0].token_ids
    assert rows["tokens"] == want
