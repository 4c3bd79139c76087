"""The process-local data plane: routers, their transport and handles. It runs in
proxies and replicas, never in the control loop; it depends on the control plane only
through the wire and kernel modules (``wire``, ``errors``, ``clock``, ``settings``)."""
