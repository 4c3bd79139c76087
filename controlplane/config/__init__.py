"""The user-facing deploy config: schema, bounds, instance options, Serve compatibility."""
