"""Bad input changes nothing; a constructor that raises is reported, with bounded retries.
Bad user code (import_path, constructor args, user_config, runtime_env) is one line naming
the application and the field, the traceback behind it (``BuildError.detail``)."""

from __future__ import annotations

import io

import pytest
import ray
from ray.exceptions import RayTaskError

from controlplane.errors import BuildError, ConfigError, DeployRejected
from fleetplane.cli_errors import EXIT_FAILED, report
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


APPS = "tests.integration.apps"
NO_DIR = "/nonexistent/fleetplane-working-dir"
BAD_CODE = {
    "module not found": (app("bad", "tests.integration.no_such_module:Model"),
                         "import_path 'tests.integration.no_such_module:Model': module "
                         "'tests.integration.no_such_module' not found; check the name, and "
                         "that the module is installed on the cluster or shipped in "
                         "runtime_env"),
    "module raises": (app("bad", "tests.integration.raises_on_import:Model"),
                      "import_path 'tests.integration.raises_on_import:Model': importing "
                      "module 'tests.integration.raises_on_import' raised RuntimeError: "
                      "MODEL_DIR is not set"),
    "no attribute": (app("bad", f"{APPS}:NoSuchModel"),
                     f"import_path '{APPS}:NoSuchModel': module '{APPS}' has no attribute "
                     f"'NoSuchModel'"),
    "args to a class taking none": (
        app("bad", f"{APPS}:BrokenModel", deployments=[{"name": "BrokenModel"}],
            args={"size": 2}),
        "args do not fit BrokenModel(), the constructor of deployment 'BrokenModel': got an "
        "unexpected keyword argument 'size'; fix args in the config"),
    "user_config without reconfigure": (
        app("bad", f"{APPS}:BrokenModel",
            deployments=[{"name": "BrokenModel", "user_config": {"k": 1}}]),
        "deployment 'BrokenModel' sets user_config but its class has no reconfigure(self, "
        "config) method to receive it; add one or remove user_config"),
    "working_dir missing": (app("bad", runtime_env={"working_dir": NO_DIR}),
                            f"runtime_env: {NO_DIR} is not a valid path."),
    "runtime_env setup fails": (
        app("bad", runtime_env={"working_dir": "file:///nonexistent/fleetplane.zip"}),
        "runtime_env could not be set up: FileNotFoundError: [Errno 2] No such file or "
        "directory: '/nonexistent/fleetplane.zip'"),
    "deployment runtime_env": (
        app("bad", deployments=[{"name": "Model", "ray_actor_options": {
            "num_cpus": 0, "runtime_env": {"py_modules": [NO_DIR]}}}]),
        f"deployment 'Model': ray_actor_options.runtime_env: {NO_DIR} is not a valid path."),
}


@pytest.mark.parametrize("case", BAD_CODE)
def test_bad_user_code_is_one_line_naming_app_and_field_and_changes_nothing(fleet, case):
    bad_app, message = BAD_CODE[case]
    before = fleet.status()
    with pytest.raises(BuildError) as raised:  # beside a good app: all or nothing
        deploy(fleet, app("stable"), bad_app)
    assert (raised.value.app, raised.value.message) == ("bad", message)
    after = fleet.status()
    assert after["controller"]["generation"] == before["controller"]["generation"]
    assert set(after["applications"]) == set(before["applications"])


def test_the_cli_prints_a_line_per_failed_application_traceback_behind_verbose(fleet):
    with pytest.raises(BuildError) as raised:
        deploy(fleet, app("stable"), app("one", "tests.integration.raises_on_import:Model"),
               app("two", f"{APPS}:NoSuchModel"))
    assert "raises_on_import.py" in raised.value.detail  # the user's traceback came along
    out = io.StringIO()
    assert report(raised.value, out, verbose=False, refused=True) == EXIT_FAILED
    assert out.getvalue().splitlines() == [
        "error: application 'one': import_path 'tests.integration.raises_on_import:Model': "
        "importing module 'tests.integration.raises_on_import' raised RuntimeError: "
        "MODEL_DIR is not set (--verbose shows the traceback)",
        f"error: application 'two': import_path '{APPS}:NoSuchModel': module '{APPS}' has no "
        f"attribute 'NoSuchModel'",
        "nothing was changed."]
    out = io.StringIO()
    report(raised.value, out, verbose=True, refused=True)
    assert "Traceback (most recent call last)" in out.getvalue()
