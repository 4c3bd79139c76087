"""The fleetplane command line: the composition root that wires the control plane
(``controlplane``) and the replica-side tools (``replicas``) into one console script.

Also fleetplane's Python API for driver scripts connected to the cluster
(``ray.init(address=...)``): ``get_app_handle(name)`` and
``get_deployment_handle(deployment, app_name)``. Importing this package makes Ray Serve's
functions of the same names answer from fleetplane too (``serve_api.install_serve_api``).
"""

from controlplane.routing.serve_api import get_app_handle, get_deployment_handle, install_serve_api

install_serve_api()

__all__ = ["get_app_handle", "get_deployment_handle"]
