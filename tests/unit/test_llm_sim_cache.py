"""The engine simulator's token mode: prompts read from a shared per-step budget, less the
prefix its LRU cache holds, and the vLLM series that report it. A fake wall; no I/O."""

from __future__ import annotations

from replicas.llm_metrics import parse_metrics
from tests.llm_sim.engine import SimEngine
from tests.llm_sim.prefix_cache import BLOCK_CHARS, GB10, PrefixCache, block_keys, prompt_text

SYSTEM = "You answer in French. " * 200  # 4,400 characters: 1,100 tokens


def engine(cache_blocks: int = 4096) -> SimEngine:
    return SimEngine("m", GB10.slots, wall=lambda: 0.0,
                     prefill_tokens_per_step=GB10.prefill_tokens_per_step,
                     cache_blocks=cache_blocks)


def steps_to_first_token(e: SimEngine, prompt: str, max_tokens: int = 2) -> int:
    request = e.submit(max_tokens, prompt=prompt)
    steps = 0
    while request.output_tokens == 0:
        assert e.step()
        steps += 1
    e.step_until_done(request, 100)
    return steps


def test_an_uncached_prompt_is_read_at_the_calibrated_rate_and_a_repeat_from_the_cache():
    e = engine()
    cold = steps_to_first_token(e, SYSTEM + "Question one?")
    assert cold == -(-1104 // GB10.prefill_tokens_per_step) + 1  # read, then the first token
    # seconds at the GB10 calibration: 1,104 tokens in ~0.7 s, the guide's ~1,700 tokens/s
    assert 0.6 < cold * GB10.step_s < 0.8
    warm = steps_to_first_token(e, SYSTEM + "Another question?")
    assert warm <= 2  # only the blocks after the shared 1,100 tokens
    assert e.cache.hits_tokens >= 1088 and e.cache.queries_tokens == 1104 + 1105


def test_requests_reading_prompts_share_the_steps_budget():
    e = engine()
    first = e.submit(1, prompt="a" * 4 * 730)  # 730 tokens: 10 steps alone
    second = e.submit(1, prompt="b" * 4 * 730)
    for _ in range(10):
        e.step()
    assert first.prompt_left == 0 and second.prompt_left == 730  # first come, first read
    for _ in range(10):
        e.step()
    assert first.done and second.prompt_left == 0


def test_the_cache_evicts_the_least_recently_used_blocks():
    cache = PrefixCache(capacity_blocks=4)
    a, b = block_keys("a" * BLOCK_CHARS * 3), block_keys("b" * BLOCK_CHARS * 2)
    cache.insert(a)
    cache.lookup(a[:1], 16 * 3)  # a's first block used again
    cache.insert(b)  # 5 blocks: a's second goes (a's first was used since)
    assert len(cache) == 4 and cache.lookup(a, 48) == 16  # a's run now stops at block 2


def test_the_metrics_are_vllms_and_the_health_check_reads_kv_use():
    e = engine(cache_blocks=100)
    e.submit(1000, prompt="x" * 4 * 800)  # 800 tokens: 50 blocks held while it runs
    e.step()
    text = e.metrics_text()
    for name in ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total"):
        assert name in text
    assert parse_metrics(text, at_s=0).kv_cache_usage == 0.5


def test_the_engine_reads_a_completions_prompt_or_a_chat_through_a_template():
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    assert prompt_text(body) == "<|system|>s<|user|>u"
    assert prompt_text({"prompt": ["p", "q"]}) == "p" and prompt_text({}) == ""
