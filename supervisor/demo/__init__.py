"""The embedded demo: a tiny CPU training with a real crash and a preemption (``supervise demo``)."""
