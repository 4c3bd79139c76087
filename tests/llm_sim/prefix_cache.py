"""The simulator's prefix cache and prompt reading: what LLM-aware routing changes.

Prompts become tokens at ``CHARS_PER_TOKEN`` characters a token (about English text's with
Llama- and Nemotron-family tokenizers) and tokens become blocks of ``BLOCK_TOKENS`` (vLLM's
default block size), each block keyed by a hash chained to the blocks before it, as vLLM's
automatic prefix caching keys them: a block is reused only after the same whole prefix.

``PrefixCache`` keeps at most ``capacity_blocks`` blocks and evicts the least recently used
first, as vLLM's free-block queue does (cached blocks that no running request holds are
reused oldest first). A request's cached prefix is looked up when it is scheduled, and its
prompt blocks are cached once its prefill is done (two requests that arrive together with
one new prefix both compute it, as on vLLM).

Timings (``Calibration``): vLLM's DGX Spark (GB10) guide, June 2026, serving
Nemotron-3-Super-120B-A12B-NVFP4 with ``--max-num-seqs 4``: decode 22.7-23.7 tokens/s a
stream (a step every ~43 ms), prefill ~1,636 tokens/s at 1,834 prompt tokens (TTFT 1.12 s)
and ~1,884 tokens/s at 7,234 (TTFT 3.85 s): ~73 prompt tokens a step. The KV-cache size is
not in the guide: ``capacity_blocks`` is stated by each run.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4
BLOCK_TOKENS = 16
BLOCK_CHARS = CHARS_PER_TOKEN * BLOCK_TOKENS


@dataclass(frozen=True)
class Calibration:
    """GB10 running Nemotron-3-Super-120B-A12B-NVFP4, 4 sequences (vLLM's DGX Spark guide)."""

    step_s: float = 1 / 23.2  # one decode token a stream a step: 23.2 tokens/s
    prefill_tokens_per_step: int = 73  # ~1,700 prompt tokens/s over those steps
    slots: int = 4  # --max-num-seqs 4


GB10 = Calibration()


def prompt_text(body: dict[str, Any]) -> str:
    """What the engine reads: a completion's prompt, or a chat's messages through a plain
    template (role, content, in order); '' when neither."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else ""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            content = message.get("content")
            parts.append(f"<|{message.get('role')}|>{content if isinstance(content, str) else ''}")
    return "".join(parts)


def prompt_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def block_keys(text: str) -> tuple[int, ...]:
    """A key per full block of the prompt, each chained to those before it."""
    keys, key = [], 0
    for end in range(BLOCK_CHARS, len(text) + 1, BLOCK_CHARS):
        key = hash((key, text[end - BLOCK_CHARS:end]))
        keys.append(key)
    return tuple(keys)


class PrefixCache:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()  # oldest use first
        self.queries_tokens = 0  # vllm:prefix_cache_queries: prompt tokens looked up
        self.hits_tokens = 0  # vllm:prefix_cache_hits: of those, found cached

    def lookup(self, keys: tuple[int, ...], tokens: int) -> int:
        """The tokens of the prompt's cached prefix (whole blocks from the first); counts
        the query and the hit, and marks the hit blocks used now."""
        hit = 0
        for key in keys:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit += 1
        cached = min(hit * BLOCK_TOKENS, max(0, tokens - 1))  # vLLM computes the last token
        self.queries_tokens += tokens
        self.hits_tokens += cached
        return cached

    def insert(self, keys: tuple[int, ...]) -> None:
        """A prompt's blocks are computed: cached, most recently used; the oldest go."""
        for key in keys:
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)
