"""What the daemon knows of each supervisor task: its figures (book), its uploads in
flight and its lock (inflight), its seal or fail verdict (seals), the daemons its driver
declared lost (verdicts)."""
