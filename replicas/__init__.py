"""fleetplane's replica actor and the wrapper around user code."""
