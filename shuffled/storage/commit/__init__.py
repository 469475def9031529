"""The group commit: written partials made durable and visible together, and the
commit horizon paged readers stop at."""
