"""The `ratchet` command line. Empty, so that `launch` can patch for gevent before anything loads."""
