"""A task's life on the daemon: the start (reconciling and loading), seals and fail
verdicts, lost-daemon verdicts, removal, and the figures of the tasks held."""
