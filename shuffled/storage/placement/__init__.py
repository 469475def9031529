"""Where bytes go: a location by round robin over the healthy ones with room, and an
open pack there (the idle-pack pool, pack numbers)."""
