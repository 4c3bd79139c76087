"""Bad input changes nothing; a constructor that raises is reported, with bounded retries."""

from __future__ import annotations

import pytest
import ray
from ray.exceptions import RayTaskError

from controlplane.errors import BuildError, ConfigError, DeployRejected
from tests.integration.conftest import app, dep_status, deploy, settled, wait_for

pytestmark = pytest.mark.integration


def test_bad_configs_change_nothing(fleet):
    deploy(fleet, app("stable", deployments=[{"name": "Model", "num_replicas": 1}]))
    before = wait_for(fleet, settled("stable", 1))
    generation = before["controller"]["generation"]

    with pytest.raises(BuildError, match="no_such_module"):
        deploy(fleet, app("stable"), app("other", "no_such_module:Model"))
    with pytest.raises(BuildError, match=r"\['Typo'\].*\[Model\]"):
        deploy(fleet, app("stable", deployments=[{"name": "Typo"}]))
    with pytest.raises(DeployRejected, match="num_shards cannot change"):
        deploy(fleet, app("stable"), num_shards=3)
    # The CLI validates before sending; the controller validates again at its own edge.
    with pytest.raises(RayTaskError) as raised:
        ray.get(fleet.controller().deploy.remote({"applications": [{"name": "x"}]}))
    assert isinstance(raised.value.cause, ConfigError)
    assert any("import_path" in e for e in raised.value.cause.errors)

    after = fleet.status()
    assert after["controller"]["generation"] == generation
    assert set(after["applications"]) == {"stable"}
    assert [r["replica_id"] for r in dep_status(after, "stable")["replicas"]] == \
        [r["replica_id"] for r in dep_status(before, "stable")["replicas"]]


def test_constructor_failure_is_deploy_failed_with_traceback(fleet):
    deploy(fleet, app("broken", "tests.integration.apps:BrokenModel",
                      deployments=[{"name": "BrokenModel", "num_replicas": 1}]))
    status = wait_for(fleet, lambda s: s["applications"].get("broken", {}).get("status")
                      == "DEPLOY_FAILED", what="DEPLOY_FAILED")
    dep = dep_status(status, "broken", "BrokenModel")
    assert "weights file not found: /models/broken.bin" in dep["message"]
    assert "RuntimeError" in dep["message"]
    assert dep["replicas"] == []
