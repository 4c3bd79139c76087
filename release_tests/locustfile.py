"""Locust load for a running fleetplane (loopback only), e.g.:

    locust -f release_tests/locustfile.py --headless -u 16 -r 16 -t 30s \
        --host http://127.0.0.1:8000

Backpressure rejections (429/503) are counted as their own outcome, not as failures of
the system under test, and their Retry-After header is checked to be delay-seconds.
"""

from locust import FastHttpUser, constant, task


class NoopUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def noop(self) -> None:
        with self.client.get("/noop", catch_response=True, name="/noop") as response:
            if response.status_code in (429, 503):
                retry_after = response.headers.get("Retry-After")
                if retry_after is not None and not retry_after.isdigit():
                    response.failure(f"Retry-After is not delay-seconds: {retry_after!r}")
                else:
                    response.success()
            elif response.status_code != 200:
                response.failure(f"status {response.status_code}")
