"""Where the control actors run (``fleetplane run --control-plane-on``), without Ray."""

from __future__ import annotations

import pytest

from controlplane import replica_client
from controlplane.control_placement import control_options
from controlplane.settings import Settings


def test_the_head_by_default_workers_or_rays_choice_on_request(monkeypatch):
    monkeypatch.setattr(replica_client.HeadNode, "__call__", lambda self: "head-id")
    assert Settings().control_plane_on == "head"
    assert control_options("head") == {"resources": {"node:__internal_head__": 0.001}}
    assert control_options("workers") == {
        "scheduling_strategy": "SPREAD", "label_selector": {"ray.io/node-id": "!head-id"},
        "fallback_strategy": [{"label_selector": {}}]}  # the head when it alone can
    assert control_options("any") == {}
    with pytest.raises(ValueError, match="control_plane_on: 'moon' is none of head, workers"):
        control_options("moon")


def test_the_choice_travels_to_the_shards_and_the_facade_with_the_settings():
    settings = Settings(control_plane_on="workers")
    assert Settings.from_dict(settings.to_dict()).control_plane_on == "workers"
