"""What the product runs: ``percolake serve`` and the replicas' control plane.

``config`` (:class:`~percolake.serve.config.ServeConfig`, what a server is asked to
run), ``startup`` (the checks that fail before the store is opened and the leader lease
touched), ``running`` (:class:`~percolake.serve.running.RunningServer`: the services
composed on one gRPC server, and its drain), ``health`` (the gRPC health statuses,
following the ability to serve), ``reflection``, ``command`` (``percolake serve``
itself: arguments to config, signals, exit codes), ``signals`` (the stop signals,
noticed by the main thread whichever thread the kernel hands them to), ``arguments``
(its flags, cheap to import), ``replica``
(:class:`~percolake.serve.replica.ControlPlane`, one replica of the oracle and lock
server) and ``status`` (``percolake status`` and the control
service it asks). ``testing`` holds the switches only test builds set.

Nothing here imports :mod:`percolake.tools`; the tools (the chaos test build among them)
import this package. Importing it imports none of its modules, so that every
``percolake`` command can build its parser without loading gRPC.
"""
