"""fleetplane's control plane: config, controller and shards, reconcile, ranks, CLI."""
