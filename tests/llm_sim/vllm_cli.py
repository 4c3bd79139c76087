"""The simulator behind vLLM's own command line: ``vllm serve MODEL --host H --port P
--max-num-seqs N [...]``, what ``VLLMServer``'s default command runs.

The separate-environment form of LLM.md ("Installing vLLM for the replicas") points
``command`` at another environment's ``bin/vllm``; a test writes an executable ``bin/vllm``
that runs this module, so that form is exercised end to end with the simulator standing in
for the binary. vLLM's other flags (``--tensor-parallel-size``, ``--gpu-memory-utilization``,
``--max-model-len``...) are accepted and ignored, as flags of a real engine the simulator
does not model.
"""

from __future__ import annotations

import argparse
import sys

from tests.llm_sim.__main__ import main as sim_main


def to_sim_args(argv: list[str]) -> list[str]:
    """vLLM's ``serve`` arguments as the simulator's."""
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("command", choices=["serve"])
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--served-model-name", default=None)
    args, _ignored = p.parse_known_args(argv)
    return ["--host", args.host, "--port", str(args.port), "--slots", str(args.max_num_seqs),
            "--model", args.served_model_name or args.model, "--step-rate-hz", "200"]


if __name__ == "__main__":
    sys.exit(sim_main(to_sim_args(sys.argv[1:])))
