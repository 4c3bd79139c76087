"""The fleetplane command line: the composition root that wires the control plane
(``controlplane``) and the replica-side tools (``replicas``) into one console script."""
