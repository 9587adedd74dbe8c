"""A job's plumbing: the launchers' environments, the launcher, rendezvous and its store, the gate
and authentication of connections, the reaper of shared-memory names, host load."""
