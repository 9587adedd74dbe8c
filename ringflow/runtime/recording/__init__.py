"""Recording calls: the call recorder, its per-call path in C, the rows it writes, the flight ring."""
