"""The `hybrid` command: make-model, generate (text, ids, --json, logprobs), chat (in-process
and against a live server), and the demo model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cli.main import main
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import read_spec
from tests.test_server_support import API_KEY, live_server  # noqa: F401


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_make_model_presets_and_flags(capsys, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "make-model", "--preset", "tiny-v2-lite", "--quant", "q8_0",
                       "--layout", "mla", "--split", "2", "--out", str(tmp_path))
    assert code == 0
    files = [Path(line) for line in out.split()]
    assert [f.name for f in files] == [
        "tiny-v2-lite-q8_0-mla-00001-of-00002.gguf", "tiny-v2-lite-q8_0-mla-00002-of-00002.gguf"
    ]
    spec = read_spec(GGUFModelFile(files[0]))
    assert (spec.layout, spec.q_lora_rank, spec.scoring_func, spec.num_layers) == (
        "mla", None, "softmax", 27)


def test_make_model_v3_layers_is_real_width(capsys, tmp_path: Path) -> None:
    # Header only: a 1-layer V3 is ~2 GB at q4_k_m, so check what the preset would write.
    from hybrid.synth.make_model import spec_for
    from hybrid.synth.presets import get_preset

    spec = spec_for(get_preset("v3", num_layers=5), "legacy", 129280)
    assert (spec.hidden_size, spec.num_heads, spec.num_experts, spec.num_experts_per_tok,
            spec.moe_intermediate_size, spec.first_k_dense) == (7168, 128, 256, 8, 2048, 3)
    code, _, err = run(capsys, "make-model", "--preset", "v3", "--layers", "27", "--out", "x")
    assert code == 2 and "only at 26 or 27 layers" in err


def test_make_model_is_deterministic(capsys, tmp_path: Path) -> None:
    paths = []
    for name in ("a.gguf", "b.gguf"):
        run(capsys, "make-model", "--preset", "tiny-v3", "--seed", "5", "--out", str(tmp_path / name))
        paths.append(tmp_path / name)
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_generate_json_with_logprobs(capsys, models) -> None:
    path = str(models.path("tiny-v3", "q4_k_m"))
    code, out, _ = run(capsys, "generate", "--gguf-path", path, "--prompt-ids", "0,5,6,7",
                       "--max-new-tokens", "6", "--temperature", "0", "--logprobs", "1", "--json")
    assert code == 0
    result = json.loads(out)
    assert len(result["token_ids"]) == 6 and len(result["logprobs"]) == 6
    assert all(lp <= 0 and math.isfinite(lp) for lp in result["logprobs"])
    assert result["finish_reason"] in ("length", "stop")


def test_sampling_is_seeded(capsys, models) -> None:
    path = str(models.path("tiny-v3", "q4_k_m"))
    outs = []
    for seed in ("1", "1", "2"):
        _, out, _ = run(capsys, "generate", "--gguf-path", path, "--prompt", "Hello",
                        "--max-new-tokens", "8", "--temperature", "1.0", "--seed", seed, "--json")
        outs.append(json.loads(out)["token_ids"])
    assert outs[0] == outs[1] != outs[2]


def test_bad_flags(capsys, models) -> None:
    path = str(models.path("tiny-v3", "q4_k_m"))
    code, _, err = run(capsys, "generate", "--gguf-path", path, "--prompt-ids", "1,x")
    assert code == 2 and "comma-separated integers" in err
    code, _, err = run(capsys, "generate", "--gguf-path", path, "--prompt-ids", "999999")
    assert code == 2 and "outside the vocabulary" in err
    code, _, err = run(capsys, "generate", "--gguf-path", path)
    assert code == 2 and "exactly one of --prompt" in err
    code, _, err = run(capsys, "generate", "--gguf-path", path, "--prompt", "x", "--top-p", "0")
    assert code == 2 and "top_p must be in (0, 1]" in err


def test_demo_model_answers(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path))
    code, out, err = run(capsys, "generate", "--prompt", "Hello!", "--chat-template",
                         "--max-new-tokens", "5", "--temperature", "0", "--json")
    assert code == 0, err
    assert "building the demo model" in err
    assert len(json.loads(out)["token_ids"]) >= 1
    assert (tmp_path / "demo").is_dir()


def test_chat_is_multi_turn_and_streams(models) -> None:
    import subprocess
    import sys

    path = str(models.path("tiny-v3", "q4_k_m"))
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "chat", "--gguf-path", path, "--optimize-rules",
         "cpu", "--max-new-tokens", "4", "--temperature", "0", "--system", "Be brief."],
        input="Hello\nAnd then?\n/exit\n", capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    turns = proc.stdout.split(">>> ")
    assert len(turns) == 4 and turns[0] == "" and turns[3] == ""
    assert all(t.endswith("\n") and len(t) > 1 for t in turns[1:3])


def test_chat_url_streams_from_a_running_server(live_server) -> None:  # noqa: F811
    import subprocess
    import sys

    import httpx

    proc = subprocess.run(
        [sys.executable, "-m", "cli", "chat", "--url", live_server.url, "--api-key",
         API_KEY, "--max-new-tokens", "5", "--temperature", "0", "--repetition-penalty", "1.2",
         "--system", "Be brief."],
        input="Hello\nAnd then?\n/exit\n", capture_output=True, text=True, timeout=120,
        check=False)
    assert proc.returncode == 0, proc.stderr
    turns = proc.stdout.split(">>> ")
    assert len(turns) == 4 and turns[0] == turns[3] == ""
    messages = [{"role": "system", "content": "Be brief."}]
    for line, turn in zip(("Hello", "And then?"), turns[1:3]):
        messages.append({"role": "user", "content": line})
        ref = httpx.post(f"{live_server.url}/v1/chat/completions", timeout=60, json={
            "model": live_server.state.model.name, "messages": messages, "max_tokens": 5,
            "temperature": 0, "repetition_penalty": 1.2},
            headers={"Authorization": f"Bearer {API_KEY}"}).json()
        reply = ref["choices"][0]["message"]["content"]
        assert turn == reply + "\n"
        messages.append({"role": "assistant", "content": reply})


def test_chat_url_errors_are_one_line(capsys, live_server) -> None:  # noqa: F811
    code, _, err = run(capsys, "chat", "--url", live_server.url, "--api-key", "wrong")
    assert code == 2 and err == (f"error: {live_server.url}/v1/models answered 401: incorrect "
                                 "API key provided\n")
    code, _, err = run(capsys, "chat", "--url", "http://127.0.0.1:9")
    assert code == 2 and err.startswith("error: cannot reach http://127.0.0.1:9: ")


def test_bench_reports_latency_and_speed(capsys, live_server) -> None:  # noqa: F811
    code, out, _ = run(capsys, "bench", "--url", live_server.url, "--api-key", API_KEY,
                       "--concurrency", "2", "--num-requests", "3", "--prompt-len", "4",
                       "--gen-len", "5", "--json")
    assert code == 0
    result = json.loads(out)
    assert (result["concurrency"], result["num_requests"], result["total_tokens"]) == (2, 3, 15)
    for key in ("ttft_mean_s", "ttft_p50_s", "itl_mean_s", "itl_p50_s",
                "stream_tokens_per_s_mean", "aggregate_tokens_per_s"):
        assert result[key] > 0, key
    code, out, _ = run(capsys, "bench", "--url", live_server.url, "--api-key", API_KEY,
                       "--num-requests", "1", "--gen-len", "2")
    assert code == 0 and "TTFT mean / p50" in out and "aggregate tokens/s" in out


def test_progress_in_a_log_is_one_line_at_start_and_one_at_the_end(capsys) -> None:
    """Not a terminal (a log, a pipe, this test): no carriage-return updates, sane totals."""
    from cli.progress import progress_bar

    update = progress_bar("loading")
    for done in range(0, 3 * 10**9 + 1, 10**8):
        update(done, 3 * 10**9)
    update(3 * 10**9, 3 * 10**9)  # a repeated last call prints nothing more
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "\r" not in "".join(lines)
    assert lines[0] == "loading: 3.00 GB ..."
    assert lines[1].startswith("loading: 3.00 GB in ") and lines[1].endswith(" GB/s")


def test_tune_without_gguf_path_tunes_the_demo_model(monkeypatch, tmp_path) -> None:
    import hybrid.tuning.tune
    from cli.main import main
    from hybrid.demo import demo_model_path

    seen = []

    def fake_tune(opts, status=None):
        seen.append(opts)
        raise KeyboardInterrupt  # stop here: only the options are under test

    monkeypatch.setattr(hybrid.tuning.tune, "tune", fake_tune)
    assert main(["tune", "--profile", str(tmp_path / "p.json"), "--gpu-memory", "1GiB",
                 "--out", str(tmp_path / "t.yaml")]) == 130
    assert seen[0].gguf_path == str(demo_model_path())


def test_every_option_has_help_that_shows_its_default() -> None:
    import argparse

    from cli.main import build_parser

    missing, parser = [], build_parser()

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{path} {name}")
            elif a.option_strings and not isinstance(a, argparse._HelpAction):
                if not a.help:
                    missing.append(f"{path} {a.option_strings[0]}: no help")
                elif isinstance(a, argparse._StoreFalseAction):  # --no-x: says what it does
                    text = p.formatter_class("x")._get_help_string(a)
                    if "(default: " in text:
                        missing.append(f"{path} {a.option_strings[0]}: a switch's default shown")
                elif a.default not in (None, False, argparse.SUPPRESS):
                    text = p.formatter_class("x")._get_help_string(a) % {"default": a.default}
                    if str(a.default) not in text:
                        missing.append(f"{path} {a.option_strings[0]}: default not shown")

    walk(parser, "hybrid")
    assert missing == []
