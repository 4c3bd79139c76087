"""The HTTP listeners of a node: the proxy actors and the haproxy mode's HAProxy."""
