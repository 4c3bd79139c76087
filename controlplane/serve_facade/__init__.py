"""Ray Serve's own tools, answered by fleetplane (issue 31).

Ray's ``serve`` CLI, Ray's dashboard (its ``/api/serve/applications/`` REST API, which
KubeRay's RayService drives) and a driver's ``serve.get_app_handle`` / ``serve.status()``
/ ``serve.delete()`` all find Serve the same way: the actor named
``SERVE_CONTROLLER_ACTOR`` in the ``serve`` namespace. fleetplane's controller starts one
under that name (``serve_controller.ServeFacade``, a thin class over ``core``) that answers the calls those tools make from
fleetplane's state, with Serve's own pydantic models and protobufs (``details``), and
applies their configs through fleetplane's deploy (``apply``). Because the name is taken,
none of them can start a real Serve controller beside fleetplane.

- ``details``: fleetplane's status -> ``ServeInstanceDetails`` and Serve's status protos.
- ``apply``: a Serve config (``ServeDeploySchema``) merged into the running config.
- ``serve_controller``: the actor, thin (it loads in a driver without fleetplane);
  ``core``: what it answers (controller methods, long-poll for driver handles).
- ``host``: the controller's side: make it, restart its REST API, end it.
- ``bridge``: one small actor per deployment a driver's Serve handle calls; it speaks
  Serve's replica protocol and forwards to fleetplane's router.
- ``rest``: the same REST API on a port of its own where the cluster has no dashboard
  (``fleetplane run``'s embedded Ray), guarded by Ray's token.
"""
