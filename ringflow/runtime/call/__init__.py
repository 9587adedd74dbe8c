"""The call path: the communicator, its collectives and point-to-point calls, what it remembers about
calls, and the executors (Python and native) that run a call's plan."""
