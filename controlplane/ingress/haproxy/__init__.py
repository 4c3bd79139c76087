"""The ``haproxy`` ingress mode: one real HAProxy per node in front of replicas that serve
HTTP themselves (direct ingress). ``config`` renders its configuration, ``membership``
turns replica-set changes into runtime-API commands, ``process`` runs it in master-worker
mode, ``ingress`` is the per-node Ray actor that ties them together."""
