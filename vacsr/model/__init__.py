"""Model parts: open_clip backbone wrapper, GPO, the variational adapter and its losses."""
