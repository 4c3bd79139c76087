"""Ray Serve apps whose options set in code are valid Serve but out of fleetplane's bounds
(``test_config_bounds``): each must fail its build, naming application, deployment, option."""

from __future__ import annotations

from ray import serve


class Model:
    def __call__(self, request: object) -> str:
        return "ok"

    def reconfigure(self, config: dict) -> None:
        self.config = config


tiny_health_period_app = serve.deployment(health_check_period_s=1e-9)(Model).bind()
day_long_shutdown_app = serve.deployment(graceful_shutdown_timeout_s=1e18)(Model).bind()
many_ongoing_app = serve.deployment(max_ongoing_requests=10**9)(Model).bind()
many_cpus_app = serve.deployment(ray_actor_options={"num_cpus": 2000})(Model).bind()
huge_memory_app = serve.deployment(ray_actor_options={"memory": 2**60})(Model).bind()
big_user_config_app = serve.deployment(user_config={"blob": "x" * (2 << 20)})(Model).bind()
# Within bounds: the checked amounts, and options left to Ray, pass through as written.
within_bounds_app = serve.deployment(ray_actor_options={
    "num_cpus": 0.5, "accelerator_type": "H100", "runtime_env": {"env_vars": {"A": "1"}}},
)(Model).bind()
