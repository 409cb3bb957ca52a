"""Timers from the source material, all sharing the `Scheduler` shape in `base`."""
