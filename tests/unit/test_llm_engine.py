"""The engine's command line, and the llm-health command's arguments (no process started)."""

from __future__ import annotations

import pytest

from fleetplane.cli import main
from replicas.llm_engine import DEFAULT_COMMAND, free_port, render_command

VALUES = {"model": "Qwen/Qwen3-8B", "host": "127.0.0.1", "port": 8123, "max_num_seqs": 12,
          "tensor_parallel_size": 1, "python": "/venv/bin/python"}


def test_default_command_is_vllm_serve_on_loopback():
    argv = render_command(DEFAULT_COMMAND, VALUES, ["--gpu-memory-utilization", "0.85"])
    assert argv == ["vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8123",
                    "--tensor-parallel-size", "1", "--max-num-seqs", "12",
                    "--gpu-memory-utilization", "0.85"]


def test_placeholders_are_filled_and_other_braces_left_alone():
    template = ["{python}", "-m", "sim", "--port={port}", "--cfg", '{"level": 3}']
    assert render_command(template, VALUES, ['{"model": "{model}"}']) == [
        "/venv/bin/python", "-m", "sim", "--port=8123", "--cfg", '{"level": 3}',
        '{"model": "{model}"}']  # extra args are passed as given


@pytest.mark.parametrize("bad", ["vllm serve x", [], ()])
def test_command_must_be_a_list(bad):
    with pytest.raises(ValueError, match="non-empty list"):
        render_command(bad, VALUES)


def test_free_port_is_a_port():
    assert 0 < free_port() < 65536


def test_llm_health_needs_a_url(capsys):
    assert main(["llm-health"]) == 2
    assert "at least one backend URL" in capsys.readouterr().err


def test_llm_health_rejects_a_zero_interval(capsys):
    assert main(["llm-health", "--interval-s", "0", "http://127.0.0.1:9"]) == 2


def test_llm_health_rejects_a_url_without_a_scheme(capsys):
    assert main(["llm-health", "127.0.0.1:8000", "--proxy", "http://ok:1"]) == 2
    assert "not an http(s) URL: 127.0.0.1:8000" in capsys.readouterr().err


def test_the_fetcher_answers_a_bad_url_instead_of_raising():
    from replicas.llm_http import UrllibFetcher

    result = UrllibFetcher().get("8000/metrics", timeout_s=1.0)
    assert (result.ok, result.status) == (False, None) and "bad URL" in result.error
