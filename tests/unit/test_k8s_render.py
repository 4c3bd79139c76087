"""``fleetplane k8s render``: every embedded Kubernetes object validates against the
Kubernetes schema (kubernetes-validate, strict: no unknown field), the RayCluster uses
only fields of KubeRay's documented ray.io/v1 spec, and the probes and drain hook call
what they should."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from fleetplane import k8s
from fleetplane.cli import main

K8S_VERSION = kubernetes_validate.utils.latest_version()
CONFIG = {"http_options": {"port": 8000, "host": "127.0.0.1"},
          "applications": [{"name": "llm", "route_prefix": "/v1",
                            "import_path": "deployments.demo_app:Greeter"}]}

# KubeRay's ray.io/v1 RayCluster fields used here (https://ray-project.github.io/kuberay/
# reference/api/): RayClusterSpec, HeadGroupSpec, WorkerGroupSpec.
KUBERAY_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "gcsFaultToleranceOptions"}
# KubeRay's GcsFaultToleranceOptions (raycluster_types.go)
KUBERAY_GCS_FT = {"redisAddress", "redisPassword", "redisUsername", "externalStorageNamespace"}
KUBERAY_HEAD = {"rayStartParams", "template"}
KUBERAY_WORKER = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams",
                  "template"}


def manifests(workers: int = 2, gb10: int = 2) -> list[dict]:
    return k8s.render(CONFIG, "fleet", k8s.RAY_IMAGE, workers, gb10)


def pods(objs: list[dict]) -> list[dict]:
    spec = objs[1]["spec"]
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]


def test_every_pod_template_and_object_is_valid_kubernetes():
    objs = manifests()
    for template in pods(objs):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"],
               "spec": template["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    for obj in (objs[0], objs[2]):  # the ConfigMap and the Service
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_broken_pod_template_is_caught_by_the_validation():
    template = pods(manifests())[1]
    template["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {},
                                      "spec": template["spec"]}, K8S_VERSION, strict=True)


def test_the_raycluster_uses_only_documented_kuberay_fields():
    cluster = manifests()[1]
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    assert set(cluster["spec"]) <= KUBERAY_SPEC
    assert set(cluster["spec"]["headGroupSpec"]) <= KUBERAY_HEAD
    for group in cluster["spec"]["workerGroupSpecs"]:
        assert set(group) <= KUBERAY_WORKER
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())


def test_gb10_workers_carry_the_resource_and_a_gpu_and_workers_probe_their_listener():
    cluster = manifests()[1]
    cpu, gb10 = cluster["spec"]["workerGroupSpecs"]
    assert gb10["groupName"] == "gb10" and gb10["replicas"] == 2
    assert gb10["rayStartParams"]["resources"] == "'{\"GB10\": 1}'"
    [container] = gb10["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["exec"]["command"][:3] == ["fleetplane", "probe",
                                                                  "readiness"]
    assert "--head" not in container["readinessProbe"]["exec"]["command"]
    assert "ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION" in \
        container["lifecycle"]["preStop"]["exec"]["command"][-1]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert "--head" in head[0]["readinessProbe"]["exec"]["command"]
    assert "fleetplane run /etc/fleetplane/deploy.yaml" in head[1]["command"][-1]


def test_the_config_is_shipped_with_every_node_listening_on_its_pod():
    config_map = manifests()[0]
    shipped = yaml.safe_load(config_map["data"]["deploy.yaml"])
    assert shipped["http_options"]["host"] == "0.0.0.0"
    assert shipped["applications"] == CONFIG["applications"]


def test_the_command_prints_yaml_and_an_invalid_config_prints_nothing(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(CONFIG))
    assert main(["k8s", "render", str(good), "--gb10-workers", "1"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "RayCluster", "Service"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [{name: x}]\n")
    assert main(["k8s", "render", str(bad)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "import_path" in out.err


# KubeRay's ray.io/v1 RayServiceSpec fields (ray-operator/apis/ray/v1/rayservice_types.go):
# the ones rendered are KubeRay 1.x's stable ones (upgradeStrategy etc. left to defaults).
KUBERAY_RAYSERVICE = {"serveConfigV2", "rayClusterConfig", "serveService",
                      "upgradeStrategy", "excludeHeadPodFromServeSvc"}


def rayservice() -> list[dict]:
    return k8s.render_rayservice(CONFIG, "fleet", k8s.RAY_IMAGE, 2, 1)


def test_the_rayservice_carries_the_applications_as_serves_own_config():
    from ray.serve.schema import ServeDeploySchema

    config_map, service = rayservice()
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    assert set(service["spec"]) <= KUBERAY_RAYSERVICE
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])  # a YAML string
    ServeDeploySchema.model_validate(serve_config)  # what Ray's dashboard checks it with
    assert serve_config["applications"] == CONFIG["applications"]
    shipped = yaml.safe_load(config_map["data"]["deploy.yaml"])  # fleetplane starts empty
    assert shipped["applications"] == [] and shipped["http_options"]["host"] == "0.0.0.0"


def test_the_rayservice_cluster_is_the_rayclusters_with_a_serve_api_gate_on_the_head():
    spec = rayservice()[1]["spec"]["rayClusterConfig"]
    assert set(spec) <= KUBERAY_SPEC and set(spec["headGroupSpec"]) <= KUBERAY_HEAD
    templates = [spec["headGroupSpec"]["template"]] + [g["template"]
                                                       for g in spec["workerGroupSpecs"]]
    for template in templates:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata":
                                      template["metadata"], "spec": template["spec"]},
                                     K8S_VERSION, strict=True)
        assert template["spec"]["containers"][0]["ports"][0]["name"] == "serve"  # KubeRay's
    head = spec["headGroupSpec"]["template"]["spec"]["containers"]
    probe = head[0]["readinessProbe"]["exec"]["command"]
    assert probe[probe.index("--serve-api") + 1] == "http://127.0.0.1:8265" and "--head" in probe
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert "--serve-api" not in worker["readinessProbe"]["exec"]["command"]
    assert "ray drain-node" in worker["lifecycle"]["preStop"]["exec"]["command"][-1]


def test_rayservice_refuses_fleetplanes_own_fields_naming_them(tmp_path, capsys):
    own = {**CONFIG, "applications": [{**CONFIG["applications"][0], "deployments": [
        {"name": "Greeter", "replica_start_timeout_s": 900}]}]}
    with pytest.raises(ValueError, match="replica_start_timeout_s"):
        k8s.render_rayservice(own, "fleet", k8s.RAY_IMAGE, 1, 0)
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(own))
    assert main(["k8s", "render", str(path), "--rayservice"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "without --rayservice" in out.err
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(CONFIG))
    assert main(["k8s", "render", str(good), "--rayservice"]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == \
        ["ConfigMap", "RayService"]


def test_gcs_fault_tolerance_names_the_redis_and_takes_its_password_from_a_secret(tmp_path,
                                                                                  capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    assert main(["k8s", "render", str(path), "--redis-address", "redis:6379",
                 "--redis-password-secret", "redis-auth/password"]) == 0
    cluster = list(yaml.safe_load_all(capsys.readouterr().out))[1]
    ft = cluster["spec"]["gcsFaultToleranceOptions"]
    assert set(ft) <= KUBERAY_GCS_FT and ft["redisAddress"] == "redis:6379"
    assert ft["redisPassword"] == {"valueFrom": {"secretKeyRef": {"name": "redis-auth",
                                                                  "key": "password"}}}
    assert ft["externalStorageNamespace"] == "fleetplane"
    assert main(["k8s", "render", str(path), "--redis-password-secret", "x/y"]) == 2
    assert "needs --redis-address" in capsys.readouterr().err
    assert main(["k8s", "render", str(path), "--redis-address", "r:1",
                 "--redis-password-secret", "nokey"]) == 2
    assert "SECRET/KEY" in capsys.readouterr().err
    assert "gcsFaultToleranceOptions" not in manifests()[1]["spec"]  # off unless asked
