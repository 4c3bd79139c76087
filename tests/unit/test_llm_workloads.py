"""The request streams of ``release_tests.llm_routing``: repeatable, sessions in order,
each turn's prompt the conversation so far (with the answer as the simulator words it)."""

from __future__ import annotations

from release_tests.llm_workloads import (SYSTEM_PROMPTS, TEMPLATES, RandomPrompts, SharedPrefix,
                                         reply, workload)


def bodies(load, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        request = load.next()
        out.append(request.body)
        load.answered(request, True)
    return out


def test_a_seed_gives_the_same_requests():
    def shared():
        return workload("shared_prefix", 3, clock=lambda: 0.0)

    assert bodies(shared(), 20) == bodies(shared(), 20)
    assert bodies(workload("random", 3), 5) != bodies(workload("random", 4), 5)


def test_a_sessions_next_turn_holds_the_conversation_and_waits_for_its_answer():
    now = [0.0]
    load = workload("shared_prefix", 1, clock=lambda: now[0])
    assert isinstance(load, SharedPrefix)
    chats = []
    while len(chats) < 2:
        request = load.next()
        if request.session is not None:
            chats.append(request)
        else:
            load.answered(request, True)
    first, second = chats  # the first is unanswered: the second is another session's
    assert first.session is not second.session
    load.answered(first, True)
    session = first.session
    assert session.ready_at >= 10.0  # its user reads the answer first
    now[0] = 100.0
    if session.turns_left > 0:
        turn_2 = load.next()
        while turn_2.session is not session:
            load.answered(turn_2, True)
            turn_2 = load.next()
        prior = first.body["messages"] + [
            {"role": "assistant", "content": reply(first.body["max_tokens"])}]
        assert turn_2.body["messages"][:len(prior)] == prior


def test_shared_prefixes_come_from_few_system_prompts_and_templates():
    load = workload("shared_prefix", 2)
    seen = bodies(load, 200)
    systems = {b["messages"][0]["content"] for b in seen if "messages" in b}
    templates = {b["prompt"][:4 * 2500] for b in seen if "prompt" in b}
    assert len(systems) <= SYSTEM_PROMPTS and len(templates) <= TEMPLATES
    assert 0.4 < sum("messages" in b for b in seen) / len(seen) < 0.8


def test_random_prompts_share_nothing():
    load = workload("random", 2)
    assert isinstance(load, RandomPrompts)
    seen = bodies(load, 50)
    assert len({b["messages"][0]["content"][:64] for b in seen}) == 50
