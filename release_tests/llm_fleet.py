"""The fleet ``release_tests.llm_routing`` measures: a fleetplane instance serving
``VLLMServer`` replicas on the engine simulator in token mode, and the engines themselves
(found by their command line, reset and read over their ``/sim`` endpoints)."""

from __future__ import annotations

import json
import time
import urllib.request

import psutil

from tests.llm_sim.prefix_cache import GB10

APP, DEPLOYMENT, MODEL = "llm", "VLLMServer", "routing-sim"
# Requests a replica takes: engines queue what their slots cannot run (Serve LLM's default
# is unbounded: 1e9), so routers place every request at once, by their policy.
MAX_ONGOING = 32
POLICY_SETTLE_S = 2.0  # routers and HAProxy take a policy from the shard's next push


class SimFleet:
    """``nodes``: the Ray nodes' addresses when there are several (each node's ingress
    serves on its own, ``http_options.host: node_ip``); ``base_urls``: one per node."""

    def __init__(self, args, ingress: str, proxies_per_node: int = 2,
                 nodes: tuple[str, ...] = ()) -> None:
        from controlplane.instance import Client

        self.args, self.ingress, self.proxies, self.nodes = args, ingress, proxies_per_node, nodes
        self.client = Client()
        self.max_ongoing = MAX_ONGOING
        self.base_urls = [f"http://{ip}:{args.port}/{APP}" for ip in nodes or ("127.0.0.1",)]
        self.base_url = self.base_urls[0]
        self._policy: str | None = None

    @staticmethod
    def max_ongoing_requests() -> int:
        return MAX_ONGOING

    def __enter__(self) -> "SimFleet":
        self.client.start_controller()
        self.set_policy("p2c")
        return self

    def __exit__(self, *exc) -> None:
        self.client.shutdown(timeout_s=60)

    def set_policy(self, policy: str) -> None:
        """Deploy with ``policy`` and wait for every replica RUNNING (the first time they
        start; later deploys change only the routing, no replica restarts)."""
        if policy == self._policy:
            return
        from controlplane.config.schema import parse_deploy_config

        self.client.deploy(parse_deploy_config(self._config(policy)))
        self._wait_running(policy)
        time.sleep(POLICY_SETTLE_S)
        self._policy = policy

    def _config(self, policy: str) -> dict:
        a = self.args
        command = ["{python}", "-m", "tests.llm_sim", "--host", "{host}", "--port", "{port}",
                   "--model", "{model}", "--slots", "{max_num_seqs}"]
        extra = ["--step-rate-hz", f"{a.speedup / GB10.step_s:.1f}",
                 "--prefill-tokens-per-step", str(GB10.prefill_tokens_per_step),
                 "--cache-blocks", str(a.cache_blocks), "--stream-interval-s", "0.2"]
        deployment = {"name": DEPLOYMENT, "num_replicas": a.replicas,
                      "max_ongoing_requests": MAX_ONGOING, "health_check_period_s": 1.0,
                      "ray_actor_options": {"num_cpus": 0},
                      "request_router_config": self._router(policy)}
        app = {"name": APP, "route_prefix": f"/{APP}",
               "import_path": "replicas.vllm_replica:VLLMServer",
               "args": {"model": MODEL, "max_num_seqs": GB10.slots, "command": command,
                        "extra_args": extra, "health_interval_s": 1.0,
                        "startup_timeout_s": 60.0},
               "deployments": [deployment]}
        return {"applications": [app], "controller_options": {"num_shards": 1},
                "http_options": {"host": "node_ip" if self.nodes else "127.0.0.1",
                                 "port": a.port, "ingress": self.ingress,
                                 "proxies_per_node": self.proxies}}

    def _router(self, policy: str) -> dict:
        router = {"request_router_class": policy}
        if self.args.balance_factor is not None:
            router["request_router_kwargs"] = {"balance_factor": self.args.balance_factor}
        return router

    def _wait_running(self, policy: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.client.status()
            dep = status["applications"].get(APP, {}).get("deployments", {}).get(DEPLOYMENT)
            haproxies = status["controller"].get("haproxy") or [{}]
            if (dep and dep["status"] == "HEALTHY" and dep.get("routing_policy") == policy
                    and sum(r["state"] == "RUNNING" for r in dep["replicas"]) == self.args.replicas
                    and (self.ingress != "haproxy" or all(
                        h.get("servers") == self.args.replicas for h in haproxies))):
                return
            time.sleep(0.25)
        raise TimeoutError(f"{self.args.replicas} replicas not RUNNING with {policy}")

    # ---- the engines ---------------------------------------------------------------
    def engine_urls(self) -> list[str]:
        urls = []
        for process in psutil.process_iter(["cmdline"]):
            cmd = process.info["cmdline"] or []
            if "tests.llm_sim" in cmd and MODEL in cmd and "--port" in cmd:
                urls.append(f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}")
        return sorted(urls)

    def reset_engines(self) -> None:
        for url in self.engine_urls():
            _post(f"{url}/sim/reset")

    def engine_stats(self) -> dict[str, dict]:
        return {url: _get(f"{url}/sim/stats") for url in self.engine_urls()}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _post(url: str) -> dict:
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())
